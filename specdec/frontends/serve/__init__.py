"""`specdec serve`: an OpenAI-compatible HTTP server with continuous batching (app.py: the
routes; jobs.py: a request to a Job; job.py: a Job, its events and its end; wire.py: the
wire format; lifecycle.py: serving and draining; scheduler.py: slots, queue and the batched
step loop; draft_caps.py: drafting under load; metrics.py: the Prometheus counters)."""
