"""The Python API tour of the README: load, chat prompts, a conversation, speculative decoding.

    python examples/tour.py
"""
import specdec

m = specdec.load("smollm2-135m-instruct-q4_1")          # a known id (fetched once) or a path
print(m)
print(m.tokenize("Hello, world!"))
print(repr(m.chat_prompt([{"role": "user", "content": "Hi!"}])))

conv = specdec.Conversation(m, system="Answer in one sentence.")
print(conv.say("What is the capital of France?").text)
print(conv.say("And of Italy?").text, f"({conv.n_reused} prompt tokens reused from the cache)")

target = specdec.load("qwen2.5-coder-1.5b-instruct-q4_k_m")
draft = specdec.load("qwen2.5-coder-0.5b-instruct")
prompt = target.chat_prompt([{"role": "user", "content": "Write a Python function that reverses a string."}])
spec = target.generate(prompt, n_predict=48, draft=draft, draft_n=5)
plain = target.generate(prompt, n_predict=48)
s = spec.stats
print(spec.ids == plain.ids)
print(f"{s.n_steps} steps, acceptance {s.acceptance_rate:.0%}, {s.tokens_per_step:.2f} tokens/step, "
      f"predicted {s.predicted_acceptance:.0%}")
print(spec.text)
