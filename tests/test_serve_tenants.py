"""Many users on one server (issue 50): `serve --api-keys FILE` gives each key a tenant, and the
shared caches stop telling one tenant what another sent.

The trial's two probes, driven by the official `openai` client against a real server:
- membership: does anyone's system prompt or document equal mine? (`cached_tokens` of a
  request that repeats it: more than a cold request's if it was in the cache);
- code recovery: a 2-digit code inside another client's system prompt, found by trying each
  value and watching which one comes back cached.
Across two tenants both find nothing (every probe reads as cold); within one tenant (two keys
of it) they work, as docs/server.md says; `prompt_cache_key` partitions a tenant further.
Stored responses, /metrics and a bad key file are checked alongside."""

from __future__ import annotations

import subprocess
import sys

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from prefix_edge import Runtime  # noqa: E402
from prefix_edge.errors import PrefixEdgeError  # noqa: E402

from .helpers.serve import start_server, stop_server  # noqa: E402

KEYS = {"alice": "sk-alice-1", "alice2": "sk-alice-2", "bob": "sk-bob-1"}
SYSTEM = ("You are the front desk of the Orion building. Internal note, never to be shared: the "
          "door code is {code}. Visitors sign in at the desk and wait in the lobby.")
DOCS = [{"title": "Lamp", "text": "The Orion lamp ships from Porto in three days; its warranty is two years."},
        {"title": "Kettle", "text": "The Vega kettle holds 1.7 litres and boils in four minutes."}]


@pytest.fixture(scope="module")
def served(bundle_int4, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# key tenant\n"
                    f"{KEYS['alice']} alice\n{KEYS['alice2']} alice\n\n{KEYS['bob']} bob\n")
    keys.chmod(0o600)
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "2", "--api-keys", keys)
    yield base
    rc, err = stop_server(proc)
    assert rc == 0, err


def _client(base: str, who: str):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEYS[who], max_retries=0, timeout=120)


def _cached(client, code, question: str = "Where do visitors wait?", **extra) -> int:
    r = client.chat.completions.create(
        model="base", max_tokens=2, extra_body=extra or None,
        messages=[{"role": "system", "content": SYSTEM.format(code=code)},
                  {"role": "user", "content": question}])
    return r.usage.prompt_tokens_details.cached_tokens


def test_another_tenant_cannot_tell_what_was_sent(served):
    alice, alice2, bob = _client(served, "alice"), _client(served, "alice2"), _client(served, "bob")
    # alice's prompt, read twice: it is in the cache
    assert _cached(alice, 47) == 0
    hit = _cached(alice, 47, "When does the desk open?")
    assert hit > 0
    # within her tenant (her other key) the cache is shared, as documented: the code shows
    probes = {code: _cached(alice2, code, "Is there parking?") for code in (12, 47, 80)}
    assert probes[47] == hit and probes[12] == probes[80] == 0
    # bob tries each code: every answer reads as a cold request, the right one too
    probes = {code: _cached(bob, code, "Is there parking?") for code in range(40, 50)}
    assert set(probes.values()) == {0}, probes


def test_bobs_own_repeats_still_hit(served):
    """The scope does not turn the cache off: a tenant's own repeated prompt is reused."""
    bob = _client(served, "bob")
    _cached(bob, 55, "Is there parking?")
    assert _cached(bob, 55, "Where is the lift?") > 0


def test_prompt_cache_key_partitions_a_tenant(served):
    alice = _client(served, "alice")
    assert _cached(alice, 63, prompt_cache_key="user-1") == 0
    assert _cached(alice, 63, "Is there parking?", prompt_cache_key="user-1") > 0
    assert _cached(alice, 63, "Where is the lift?", prompt_cache_key="user-2") == 0
    assert _cached(alice, 63, "Where is the lift?") == 0  # no key: her tenant's shared part


def test_composed_documents_are_per_tenant(served):
    """A document composed for alice is not reused for bob: his first composed request costs
    what alice's first did (cached_tokens of a cold composition), his second is a hit."""
    alice, bob = _client(served, "alice"), _client(served, "bob")

    def ask(client, q):
        r = client.chat.completions.create(model="base", max_tokens=2,
                                           messages=[{"role": "user", "content": q}],
                                           extra_body={"documents": DOCS, "compose_documents": True})
        return r.usage.prompt_tokens_details.cached_tokens
    cold = ask(alice, "How long is the warranty?")
    assert ask(alice, "How big is the kettle?") > cold
    assert ask(bob, "How long is the warranty?") == cold
    assert ask(bob, "How big is the kettle?") > cold


def test_stored_responses_are_per_tenant(served):
    alice, alice2, bob = _client(served, "alice"), _client(served, "alice2"), _client(served, "bob")
    r = alice.responses.create(model="base", input="Say hi.", max_output_tokens=2)
    assert alice2.responses.retrieve(r.id).id == r.id  # the same tenant
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.create(model="base", input="And then?", max_output_tokens=2, previous_response_id=r.id)
    with pytest.raises(openai.NotFoundError):
        bob.responses.delete(r.id)
    alice.responses.retrieve(r.id)  # still there


def test_metrics_need_a_key(served):
    assert httpx.get(served + "/metrics").status_code == 401
    assert httpx.get(served + "/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = httpx.get(served + "/metrics", headers={"Authorization": f"Bearer {KEYS['bob']}"})
    assert r.status_code == 200 and "prefix_edge_requests_total" in r.text
    assert httpx.get(served + "/health").status_code == 200  # a liveness probe needs none
    assert _client(served, "bob").models.list().data
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served + "/v1", api_key="sk-alice-3", max_retries=0).models.list()


def test_metrics_public_and_one_key(bundle_int4):
    proc, base = start_server(bundle_int4, "--backend", "gguf", "--slots", "1", "--api-key", "k1",
                              "--metrics-public")
    try:
        assert httpx.get(base + "/metrics").status_code == 200
        assert httpx.get(base + "/v1/models").status_code == 401
    finally:
        stop_server(proc)


@pytest.mark.parametrize("text,needle", [
    ("k1 alice extra\n", "keys.txt:1: expected `KEY TENANT`, got 3 field(s)"),
    ("# only a comment\n", "no `KEY TENANT` line"),
    ("k1 alice\nk1 bob\n", "keys.txt:2: this key is on an earlier line too"),
    ("k1 ../bob\n", "keys.txt:1: tenant '../bob' is not a name"),
])
def test_a_bad_key_file_is_one_line_before_the_model_loads(bundle_int4, tmp_path, text, needle):
    keys = tmp_path / "keys.txt"
    keys.write_text(text)
    keys.chmod(0o600)
    r = subprocess.run([sys.executable, "-m", "prefix_edge", "serve", "--bundle", str(bundle_int4),
                        "--port", "1", "--api-keys", str(keys)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_cache_scope_in_the_library(bundle_int4):
    """Runtime.generate(cache_scope=...): the same partition for an app serving several users
    itself; a bad value names the option."""
    msgs = [{"role": "system", "content": SYSTEM.format(code=21)}, {"role": "user", "content": "Hi"}]
    with Runtime.open(bundle_int4, backend="onnx") as rt:
        ref = rt.generate(None, messages=msgs, max_tokens=4, use_prompt_cache=False)
        a = [rt.generate(None, messages=msgs, max_tokens=4, cache_scope="a") for _ in range(2)]
        b = rt.generate(None, messages=msgs, max_tokens=4, cache_scope="b")
        shared = rt.generate(None, messages=msgs, max_tokens=4)
        assert [r.tokens for r in (*a, b, shared)] == [ref.tokens] * 4
        assert a[0].stats.cached_tokens == 0 and a[1].stats.cached_tokens > 0
        assert b.stats.cached_tokens == 0 and shared.stats.cached_tokens == 0
        for bad in (5, "x" * 1025):
            with pytest.raises(PrefixEdgeError, match="cache_scope"):
                rt.generate(None, messages=msgs, max_tokens=1, cache_scope=bad)
