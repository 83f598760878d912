"""Front-ends over the one request path (specdec.api.request)."""
