"""Chat templates are code from the file: rendering is sandboxed and bounded, and every
misbehaving template is a one-line ChatTemplateError (specdec.text.template)."""
from __future__ import annotations

import time

import pytest

from specdec.errors import ChatTemplateError
from specdec.text.template import CHATML, Limits, render

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
FAST = Limits(seconds=0.3)

BAD = {
    "nested huge ranges": ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                           "longer than 0.3 s"),
    "loops over big strings": ("{% for i in 'x' * 99999 %}{% for j in 'y' * 99999 %}{% endfor %}{% endfor %}",
                               "longer than 0.3 s"),
    "namespace counter": ("{% set ns = namespace(x=0) %}{% for i in range(99999) %}{% for j in range(99999) %}"
                          "{% set ns.x = ns.x + 1 %}{% endfor %}{% endfor %}", "longer than 0.3 s"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper than"),
    "recursive loop": ("{% for m in [[1]] recursive %}{{ loop([m]) }}{% endfor %}", "nested deeper than"),
    "__class__": ("{{ ''.__class__ }}", "'__class__'"),
    "__globals__": ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    "__subclasses__": ("{{ ().__class__.__base__.__subclasses__() }}", "unsafe"),
    "mro of a message": ("{{ messages[0].__class__.mro() }}", "unsafe"),
    "raise_exception": ("{{ raise_exception('Only user and\nassistant roles') }}",
                        "chat template: Only user and assistant roles"),
    "huge repetition": ("{{ 'x' * 10 ** 10 }}", "repetition"),
    "huge power": ("{{ 9 ** (9 ** 9) }}", "power"),
    "str.center": ("{{ 'x'.center(10 ** 9) }}", "str.center"),
    "center filter": ("{{ 'x'|center(10 ** 9) }}", "center filter"),
    "% width": ("{{ '%999999999d' % 1 }}", "format width"),
    "str.format width": ("{{ '{:999999999}'.format(1) }}", "format width"),
    "format filter": ("{{ '%999999999d'|format(1) }}", "format filter"),
    "join amplification": ("{{ ('y' * 3000000)|join('x' * 3000000) }}", "join filter"),
    "str.join amplification": ("{{ ('y' * 3000000).join('x' * 3000000) }}", "str.join"),
    "replace amplification": ("{{ ('x' * 3000000).replace('x', 'xxxxxx') }}", "str.replace"),
    "output too long": ("{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}", "rendered text"),
    "type error": ("{{ 1 + 'a' }}", "chat template failed"),
    "division by zero": ("{{ 1 // 0 }}", "chat template failed"),
    "undefined": ("{{ foo.bar }}", "'foo' is undefined"),
    "syntax": ("{% for %}", "does not parse"),
    "reserved name": ("{{ __specdec_loop_guard }}", "reserved name"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_template_one_line_error(name):
    source, needle = BAD[name]
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError) as e:
        render(source, MSGS, limits=FAST)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg, msg
    assert time.perf_counter() - t0 < 3.0


def test_limits_leave_ordinary_templates_alone():
    src = ("{{ bos_token }}{% for m in messages %}{{ '%s: %s' % (m.role, m.content|trim) }}"
           "{{ '{:>4}'.format(loop.index) }}{{ [1, 2]|join(', ') }}{{ 'ab' * 2 }}{{ 2 ** 10 }}\n"
           "{% endfor %}{% if add_generation_prompt %}{{ 'A:'|center(6) }}{% endif %}")
    out = render(src, MSGS, bos_token="<s>")
    assert out == "<s>system: Be brief.   11, 2abab1024\nuser: hi   21, 2abab1024\n  A:  "
    assert render(CHATML, MSGS).endswith("<|im_start|>assistant\n")


def test_output_bound_counts_the_messages():
    """A long message renders (it is the user's text); the bound is on the total output."""
    long = [{"role": "user", "content": "z" * 100_000}]
    assert len(render(CHATML, long)) == 100_000 + len("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ChatTemplateError, match="rendered text"):
        render(CHATML, long, limits=Limits(max_chars=50_000))


def test_budget_is_per_render():
    """A slow render does not leave its deadline behind for the next one."""
    with pytest.raises(ChatTemplateError):
        render(BAD["nested huge ranges"][0], MSGS, limits=FAST)
    assert render(CHATML, MSGS, limits=FAST)
