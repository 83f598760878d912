"""Speculation: the loop (speculative), the acceptance rule (verify), the drafters (one
module each), draft-length policies, the draft/target compatibility check and the trace.

p is always the target's distribution, q the draft's.
"""
