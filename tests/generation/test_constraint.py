"""Constraints as a user meets them: ConstraintSpec checks (one-line errors naming the field,
the size limit), the tokenizer built once per vocabulary, `generate(grammar= / json_schema=)`
and `Conversation.say` on a tiny synthetic GGUF model whose vocabulary has JSON's characters
(plain == speculative, greedy, with every kind of drafting), the stop reasons, and the CLI
flags (`specdec run` / `check`: --grammar, --grammar-file, -j, -jf)."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("llguidance")

import specdec  # noqa: E402
from helpers import cli, one_line_error  # noqa: E402
from specdec.errors import ConstraintError  # noqa: E402
from specdec.generation.constraint import (MAX_GRAMMAR_BYTES, ConstraintSpec, compile_constraint,  # noqa: E402
                                           ll_tokenizer)
from synth import TinySpec, write_tiny_model  # noqa: E402

TOKENS = ("<s>", "a", "b", "c", "ab", "ba", "{", "}", '"', ":", ",", '{"', '":', '"}', "1", "2", "12",
          "[", "]", "x", "y", "z", "0", "</s>")
V = len(TOKENS)
TYPES = (3,) + (1,) * (V - 2) + (3,)
SCHEMA = {"type": "object", "properties": {"ab": {"type": "integer", "minimum": 0, "maximum": 250},
                                           "c": {"enum": ["x", "yz"]}},
          "required": ["ab", "c"], "additionalProperties": False}
GBNF = 'root ::= "ab" ("ab" | "ba" | "c")* "12"'
TEMPLATE = ("{% for m in messages %}{{ m['content'] }}{% endfor %}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("constraint")
    spec = dict(n_vocab=V, tokens=TOKENS, token_types=TYPES, chat_template=TEMPLATE, logit_scale=3.0)
    t = write_tiny_model(d / "target.gguf", TinySpec(**spec))
    dm = write_tiny_model(d / "draft.gguf", TinySpec(seed=1, d_model=32, n_layer=1, **spec))
    return {"target": specdec.load(t, progress=False), "draft": specdec.load(dm, progress=False),
            "target_path": str(t), "draft_path": str(dm), "dir": d}


@pytest.mark.parametrize("spec, field, needle", [
    (ConstraintSpec("json_schema", "{not json"), "json_schema", "json_schema"),
    (ConstraintSpec("json_schema", "[1, 2]"), "json_schema", "object"),
    (ConstraintSpec("gbnf", "root ::= missing"), "grammar", "grammar"),
    (ConstraintSpec("gbnf", "   "), "grammar", "empty"),
    (ConstraintSpec("regex", "(unclosed"), "regex", "regex"),
    (ConstraintSpec("lark", "start: ("), "grammar", "grammar"),
    (ConstraintSpec("json_schema", json.dumps({"enum": ["x" * MAX_GRAMMAR_BYTES]})), "json_schema", "limit"),
    (ConstraintSpec("yaml", "a: b"), "grammar", "kind"),
])
def test_bad_constraints_are_one_line_errors_naming_the_field(spec, field, needle):
    with pytest.raises(ConstraintError) as e:
        spec.check()
    assert e.value.field == field and needle in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, specdec.SpecdecError)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["json_schema", "gbnf", "regex", "lark"]),
       source=st.one_of(st.text(max_size=120), st.sampled_from([
           '{"type": "foo"}', '{"type": "object", "properties": 3}', '{"$ref": "#/nope"}', "true",
           'root ::= "a" root2', 'root ::= [z-a]', "start: /(/", "(?P<x>a)", "a{99999999}",
           '{"type": "string", "pattern": "("}'])))
def test_any_source_checks_or_is_a_constraint_error(kind, source):
    try:
        ConstraintSpec(kind, source).check()
    except ConstraintError as e:
        assert "\n" not in str(e) and e.field in ("json_schema", "grammar", "regex")


def test_good_constraints_check_and_of():
    for spec in (ConstraintSpec("json_object"), ConstraintSpec("json_schema", json.dumps(SCHEMA)),
                 ConstraintSpec("gbnf", GBNF), ConstraintSpec("regex", "[a-c]+"),
                 ConstraintSpec("lark", 'start: "a" /[bc]+/')):
        spec.check()
    assert ConstraintSpec.of() is None
    assert ConstraintSpec.of(grammar=GBNF) == ConstraintSpec("gbnf", GBNF)
    assert ConstraintSpec.of(json_schema=SCHEMA).kind == "json_schema"
    with pytest.raises(ConstraintError, match="at most one"):
        ConstraintSpec.of(grammar=GBNF, json_schema=SCHEMA)
    with pytest.raises(ConstraintError):
        ConstraintSpec.of(json_schema=3)


def test_tokenizer_built_once_per_vocabulary(models):
    tok = models["target"].tokenizer
    assert ll_tokenizer(tok, V) is ll_tokenizer(tok, V)
    a, b = (compile_constraint(ConstraintSpec("gbnf", GBNF), tok, V) for _ in range(2))
    a.advance(TOKENS.index("a"))
    assert a.n_consumed == 1 and b.n_consumed == 0 and b.mask()[TOKENS.index("a")]   # independent matchers


def _valid(text: str, kind: str) -> bool:
    if kind == "json":
        obj = json.loads(text)
        return (set(obj) == {"ab", "c"} and isinstance(obj["ab"], int) and 0 <= obj["ab"] <= 250
                and obj["c"] in ("x", "yz"))
    return re.fullmatch("ab(ab|ba|c)*12", text) is not None


@pytest.mark.parametrize("kind", ["json", "gbnf"])
def test_generate_plain_and_speculative_agree_and_fit(models, kind):
    t, dm = models["target"], models["draft"]
    kw = dict(json_schema=SCHEMA) if kind == "json" else dict(grammar=GBNF)
    plain = t.generate([1, 2], 40, **kw)
    assert plain.stop_reason == "eog" and _valid(plain.text, kind), plain.text
    for draft in (dm, "forced", "prompt-lookup", "suffix", specdec.DraftOptions(model=dm, tree=2, n=3)):
        out = t.generate([1, 2], 40, draft=draft, **kw)
        assert (out.ids, out.stop_reason) == (plain.ids, plain.stop_reason), draft
    sampled = t.generate([1, 2], 40, temperature=1.0, seed=5, draft=dm, **kw)
    assert sampled.stop_reason != "eog" or _valid(sampled.text, kind)


def test_unfinished_constraint_ends_with_n_predict(models):
    out = models["target"].generate([1, 2], 3, json_schema=SCHEMA, draft=models["draft"])
    assert out.stop_reason == "n_predict" and len(out.ids) == 3


def test_conversation_say_takes_a_constraint(models):
    conv = specdec.Conversation(models["target"], draft=models["draft"])
    first = conv.say("ab", 40, grammar=GBNF)
    assert _valid(first.text, "gbnf")
    conv2 = specdec.Conversation(models["target"])
    assert conv2.say("ab", 40, grammar=GBNF).ids == first.ids
    with pytest.raises(ConstraintError):
        conv.say("ab", 5, json_schema="{bad")


def test_streaming_under_a_constraint(models):
    seen = []
    out = models["target"].generate([1, 2], 40, grammar=GBNF, draft="forced",
                                    on_token=lambda t, k: seen.append(t))
    assert seen == out.ids


@pytest.mark.slow
def test_cli_constraint_flags(models, tmp_path):
    t, dm = models["target_path"], models["draft_path"]
    r = cli("run", "-m", t, "-md", dm, "-p", "ab", "--raw", "-n", 40, "-j", json.dumps(SCHEMA),
            "--no-display-prompt", "-t", 1)
    assert r.returncode == 0, r.stderr
    assert _valid(r.stdout.strip(), "json")
    gf = tmp_path / "g.gbnf"
    gf.write_text(GBNF)
    r = cli("run", "-m", t, "-p", "ab", "--raw", "-n", 40, "--grammar-file", gf, "--no-display-prompt", "-t", 1)
    assert r.returncode == 0 and _valid(r.stdout.strip(), "gbnf"), r.stderr
    one_line_error(cli("run", "-m", t, "-p", "ab", "-j", "{bad"), "--json-schema")
    one_line_error(cli("run", "-m", t, "-p", "ab", "--grammar", "root ::= nope"), "--grammar")
    one_line_error(cli("run", "-m", t, "-p", "ab", "-jf", tmp_path / "missing.json"), "--json-schema-file")
    one_line_error(cli("run", "-m", t, "-p", "ab", "--grammar", GBNF, "-j", "{}"), "exclusive")
    r = cli("check", "-m", t, "-md", dm, "-p", "ab", "--raw", "-n", 30, "--grammar", GBNF, "-t", 1)
    assert r.returncode == 0 and "identical" in r.stdout, r.stdout + r.stderr
    r = cli("check", "-m", t, "--draft", "forced", "-p", "ab", "--raw", "-n", 2, "-j", json.dumps(SCHEMA),
            "--temp", 1, "--samples", 40, "-t", 1)
    assert r.returncode == 0 and "consistent" in r.stdout, r.stdout + r.stderr


QWEN, QWEN_DRAFT = "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct"
EXTRACT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                            "city": {"type": "string"}},
           "required": ["name", "age", "city"], "additionalProperties": False}


@pytest.mark.real
@pytest.mark.slow
def test_qwen_json_schema_plain_equals_every_drafting(real_model):
    """On Qwen's 151,936 ids: the schema's output is valid JSON, the same with forced tokens,
    the defaults (hybrid with the draft model) and a tree."""
    t, d = real_model(QWEN), real_model(QWEN_DRAFT)
    prompt = t.chat_prompt([{"role": "user", "content": "Extract as JSON: Maria Lopez, 34, lives in Seville."}])
    plain = t.generate(prompt, 60, json_schema=EXTRACT)
    obj = json.loads(plain.text)
    assert plain.stop_reason == "eog" and set(obj) == {"name", "age", "city"}
    for draft in ("forced", d, specdec.DraftOptions(model=d, tree=2, n=4)):
        out = t.generate(prompt, 60, json_schema=EXTRACT, draft=draft)
        assert (out.ids, out.stop_reason) == (plain.ids, plain.stop_reason), draft
