"""The README stays true: its Python snippets run, its links and the docs' links resolve.

Each ```python block of README.md is run as written, in a fresh namespace, in the section it
belongs to, except that the model it names (the default, Qwen2.5-Coder-1.5B) is replaced by the
small embedded model, SmolLM2-135M (the snippet's API is what is checked; ``benchmarks/research/choose_quickstart_model.py``
measures the quick-start model itself, and ``.ci/run`` checks its labels on the example
file). The vLLM, Outlines and server snippets start an engine: they run in CI's slow lane
(``engine`` marker, from the fixtures they request; see ``tests/conftest.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _server import free_port, wait_until_healthy

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTION = re.compile(r"^## (.+)$", re.MULTILINE)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
# [text](target): relative targets only (no scheme, no bare #anchor).
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def sections(text: str) -> dict[str, str]:
    """``{heading: body}`` of the README's ``## `` sections."""
    parts = SECTION.split(text)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def snippets(heading: str) -> list[str]:
    """The Python blocks of one README section (at least one, or the test fails)."""
    body = sections(README.read_text(encoding="utf-8")).get(heading)
    assert body is not None, f"README has no section '## {heading}'"
    blocks = PYTHON_BLOCK.findall(body)
    assert blocks, f"README section '{heading}' has no python block"
    return blocks


def quickstart_model() -> str:
    """The ``--model`` the quick start's commands name ("default" if none)."""
    body = sections(README.read_text(encoding="utf-8"))[
        "Quick start (a fresh machine, Python >= 3.11)"
    ]
    found = re.findall(r"--model (\S+)", "\n".join(BASH_BLOCK.findall(body)))
    return found[0] if found else "default"


SMALL = "smollm2-135m"


def small_model(code: str) -> str:
    """``code`` with the default model's names replaced by the small model's."""
    for name in ("default", "qwen2.5-coder-1.5b"):
        code = code.replace(f'"{name}"', f'"{SMALL}"')
    return code


def run_snippet(code: str) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(small_model(code), str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    return namespace


def test_quickstart_commands_are_what_ci_extracts():
    """``.ci/run`` runs the quick start's ``bash scripts/semsoft.sh classify`` lines."""
    body = sections(README.read_text(encoding="utf-8"))[
        "Quick start (a fresh machine, Python >= 3.11)"
    ]
    commands = [
        line
        for block in BASH_BLOCK.findall(body)
        for line in block.splitlines()
        if line.startswith("bash scripts/semsoft.sh classify")
    ]
    assert len(commands) == 2
    assert "--input examples/reviews.csv" in commands[1] and "--output scored.csv" in commands[1]
    # The quick start runs the package default: the model a user gets without --model
    # must be the one that answers right (.ci/run checks its labels).
    assert quickstart_model() == "default"
    assert not any("--model" in c for c in commands)


# Pages the docs build generates (mkdocs hooks), which links may name.
GENERATED = {ROOT / "docs" / "reference" / "cli.md"}


def markdown_files() -> list[Path]:
    return [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def repository_url() -> str:
    """mkdocs.yaml's ``repo_url``: the docs link files outside docs/ by their address on it."""
    found = re.search(r"^repo_url:\s*(\S+)", (ROOT / "mkdocs.yaml").read_text("utf-8"), re.M)
    assert found is not None, "mkdocs.yaml names no repo_url"
    return found.group(1).rstrip("/")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files(path):
    text = path.read_text(encoding="utf-8")
    missing = []
    blob = repository_url() + "/blob/main/"
    for target in LINK.findall(text):
        if target.startswith(blob):  # a file of this repository, by its absolute address
            if not (ROOT / target.removeprefix(blob).split("#", 1)[0]).exists():
                missing.append(target)
            continue
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same file
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists() and (path.parent / file).resolve() not in GENERATED:
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def test_a_repository_link_to_a_missing_file_is_found() -> None:
    """The check itself: an absolute repository link is checked like a relative one."""
    page = ROOT / "docs" / "_probe_links.md"
    try:
        page.write_text(f"[a]({repository_url()}/blob/main/benchmarks/results/none.md)\n", "utf-8")
        with pytest.raises(AssertionError, match="none.md"):
            test_relative_links_point_to_files(page)
    finally:
        page.unlink()


@pytest.mark.slow
def test_python_snippet_runs(model_and_tokenizer):
    (code,) = snippets("Python")
    model = quickstart_model()
    assert f'"{model}"' in code, "the Python snippet should use the quick start's model"
    namespace = run_snippet(code)
    proba = namespace["proba"]
    assert proba.shape == (2, 2)  # type: ignore[attr-defined]
    assert abs(float(proba.sum()) - 2.0) < 1e-9  # type: ignore[attr-defined]
    assert list(namespace["d"].label) == list(namespace["clf"].predict(namespace["texts"]))  # type: ignore[attr-defined]


@pytest.mark.slow
def test_transformers_snippet_runs(model_and_tokenizer):
    (code,) = snippets("transformers")
    namespace = run_snippet(code)
    result = namespace["result"]
    assert result.label in ("joy", "sadness", "anger")  # type: ignore[attr-defined]
    assert abs(sum(result.probs.values()) - 1.0) < 1e-6  # type: ignore[attr-defined]
    recorded = namespace["proc"].results[0].probs  # type: ignore[attr-defined]
    assert recorded.shape == (3,) and abs(float(recorded.sum()) - 1.0) < 1e-5


@pytest.fixture(scope="module")
def outlines_model():
    """Outlines on the default model (the name makes this an ``engine`` test)."""
    pytest.importorskip("outlines")


def test_outlines_snippet_runs(outlines_model):
    (code,) = snippets("Outlines")
    namespace = run_snippet(code)
    label = namespace["label"]
    assert label in ("joy", "sadness", "anger")
    assert abs(sum(label.probs.values()) - 1.0) < 1e-6  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def llm():
    """Nothing built here: the snippet builds its own ``LLM``. Named ``llm`` so that the
    test is an ``engine`` test; sets the CPU engine's environment as the vLLM tests do."""
    pytest.importorskip("vllm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        patch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
        yield


def test_vllm_snippet_runs(llm):
    (code,) = snippets("vLLM")
    # A CPU engine needs a bounded context and eager mode; the snippet's API is unchanged.
    code = code.replace(
        "max_logprobs=50,", "max_logprobs=50, max_model_len=512, enforce_eager=True,"
    )
    namespace = run_snippet(code)
    out = namespace["out"]
    assert out.outputs[0].text.strip() in ("joy", "sadness", "anger")  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The README's server command as written, on a free port, CPU-sized."""
    pytest.importorskip("vllm")
    pytest.importorskip("openai")
    body = sections(README.read_text(encoding="utf-8"))["Server"]
    (command,) = BASH_BLOCK.findall(body)
    port = free_port()
    command = small_model(command.replace("\\\n", " ").strip())
    # The README's "python" is the user's environment's: here, the test's interpreter.
    command = command.replace("python -m", f"{sys.executable} -m", 1)
    command = command.replace("$(python -c", f"$({sys.executable} -c")
    command += f" --port {port} --host 127.0.0.1 --max-model-len 512 --enforce-eager"
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    with open(log, "w") as sink:
        process = subprocess.Popen(  # noqa: S602 - the README's own command
            command, shell=True, env=env, stdout=sink, stderr=subprocess.STDOUT,
            executable="/bin/bash", start_new_session=True,
        )  # fmt: skip
    try:
        wait_until_healthy(process, port, log)
        yield port
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def test_server_snippet_runs(server):
    (code,) = snippets("Server")
    assert "127.0.0.1:8000" in code
    namespace = run_snippet(code.replace("127.0.0.1:8000", f"127.0.0.1:{server}"))
    probs = namespace["response"]  # the snippet printed the probabilities; read them again
    from semsoft_plugin.engines.openai import openai_label_probs

    scores = openai_label_probs(probs, namespace["request"], SMALL)
    assert set(scores) == {"positive", "negative"}
    assert abs(sum(scores.values()) - 1.0) < 1e-6
