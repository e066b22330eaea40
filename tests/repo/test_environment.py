"""The two environment descriptions agree, and CI runs the README's test command.

pyproject.toml (pip) and environment.yml (conda) must name the same packages at the same pins, so a
conda user reproduces the numbers a pip user gets. environment.yml is read with a small line parser:
no YAML library is assumed to be installed.
"""
import re

import pytest

from lab.paths import ROOT

try:
    import tomllib
except ModuleNotFoundError:                 # Python 3.10
    tomllib = pytest.importorskip("tomli")

REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")
CONDA_ONLY = {"python", "pip"}               # interpreter and installer, not packages of the project


def _normalise(req: str):
    """'LM_Eval[hf] == 0.4.13' -> ('lm-eval', '[hf]', '==0.4.13'); conda 'numpy=2.4' -> '==2.4'."""
    m = REQ.match(req)
    assert m, f"cannot parse requirement {req!r}"
    name, extras, spec = m.groups()
    name = re.sub(r"[-_.]+", "-", name).lower()
    extras = "[" + ",".join(sorted(e.strip().lower() for e in extras[1:-1].split(","))) + "]" if extras else ""
    spec = spec.replace(" ", "")
    if re.fullmatch(r"=[^=].*", spec):        # conda's single '=' pin
        spec = "=" + spec
    return name, extras, spec


def pyproject_requirements() -> dict:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(data["project"]["dependencies"]) + list(data["project"]["optional-dependencies"]["test"])
    out = {}
    for r in reqs:
        name, extras, spec = _normalise(r)
        assert name not in out, f"pyproject.toml names {name} twice"
        out[name] = (extras, spec)
    return out


def environment_yml_entries(text: str) -> tuple[list[str], list[str]]:
    """(conda dependencies, pip dependencies) from an environment.yml, by indentation alone."""
    conda, pip = [], []
    in_deps, pip_indent = False, None
    for raw in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if indent == 0:
            in_deps, pip_indent = body == "dependencies:", None
            continue
        if not in_deps or not body.startswith("- "):
            continue
        item = body[2:].strip().strip("'\"")
        if pip_indent is not None and indent > pip_indent:
            pip.append(item)
            continue
        pip_indent = None
        if item == "pip:":
            pip_indent = indent
        else:
            conda.append(item)
    return conda, pip


def environment_requirements() -> tuple[dict, list[str]]:
    conda, pip = environment_yml_entries((ROOT / "environment.yml").read_text())
    out = {}
    for r in conda + pip:
        if r.startswith("-e ") or r.startswith("--"):       # the project itself, installer flags
            continue
        name, extras, spec = _normalise(r)
        if name in CONDA_ONLY:
            continue
        assert name not in out, f"environment.yml names {name} twice"
        out[name] = (extras, spec)
    return out, conda


def test_yml_parser_reads_nested_pip_lists():
    text = ("name: x\n# comment\ndependencies:\n  - python=3.11\n  - pip\n  - numpy=2.0  # conda pin\n"
            "  - pip:\n      - torch==2.0\n      - 'lm_eval[hf]==1.0'\n      - -e .\nchannels:\n  - conda-forge\n")
    conda, pip = environment_yml_entries(text)
    assert conda == ["python=3.11", "pip", "numpy=2.0"]
    assert pip == ["torch==2.0", "lm_eval[hf]==1.0", "-e ."]
    assert _normalise("numpy=2.0") == ("numpy", "", "==2.0")
    assert _normalise("LM_Eval[HF] == 1.0") == ("lm-eval", "[hf]", "==1.0")


def test_pyproject_and_environment_yml_name_the_same_pins():
    py = pyproject_requirements()
    env, _ = environment_requirements()
    only_py = sorted(set(py) - set(env))
    only_env = sorted(set(env) - set(py))
    assert not only_py and not only_env, f"only in pyproject.toml: {only_py}; only in environment.yml: {only_env}"
    differ = {n: (py[n], env[n]) for n in py if py[n] != env[n]}
    assert not differ, f"pins differ (pyproject, environment.yml): {differ}"


def test_every_dependency_is_pinned_exactly():
    # pyproject.toml promises exact pins: the environment every number in the repository came from
    loose = {n: spec for n, (_, spec) in pyproject_requirements().items() if not spec.startswith("==")}
    assert not loose, f"dependencies without an exact '==' pin: {loose}"


def test_environment_yml_python_satisfies_requires_python():
    _, conda = environment_requirements()
    pins = [c for c in conda if re.match(r"python\s*=", c)]
    assert len(pins) == 1, f"environment.yml must pin python once, found {pins}"
    got = tuple(int(v) for v in re.findall(r"\d+", pins[0])[:2])
    need = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)", need.strip())
    assert m, f"unexpected requires-python {need!r}"
    assert got >= (int(m[1]), int(m[2])), f"environment.yml python {got} < requires-python {need}"


def _make_recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"^{re.escape(target)}\s*:(?!=)", line):
            recipe = []
            for nxt in lines[i + 1:]:
                if not nxt.startswith("\t"):
                    break
                recipe.append(nxt.strip())
            return recipe
    raise AssertionError(f"Makefile has no '{target}:' target")


def test_ci_runs_the_readme_test_command():
    ci = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.strip().startswith("#")]
    assert "make test" in ci, f".ci/run must run `make test` (the README's test command); it runs {ci}"
    assert any(re.search(r"\bpytest\b", cmd) for cmd in _make_recipe("test")), "make test must run pytest"
    assert any("lab.notebooks" in cmd for cmd in _make_recipe("notebooks")), \
        "make notebooks must run python -m lab.notebooks"


def test_readme_states_the_test_command():
    readme = (ROOT / "README.md").read_text()
    if "make " not in readme:
        pytest.skip("README.md does not list its commands yet")
    assert "make test" in readme and "make notebooks" in readme
