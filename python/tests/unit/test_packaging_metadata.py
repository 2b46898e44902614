"""The pip package's runtime dependencies come from the project's one pinned list
(tools/python-requirements.txt): the lines tagged "# runtime", with the range each names."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
import conflux_build_backend as backend  # noqa: E402


def _pins(path):
    pins = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            code = line.partition("#")[0].strip()
            if "==" in code:
                name, version = code.split("==")
                pins[name.split("[")[0]] = version
    return pins


def test_the_metadata_names_the_tagged_lines_with_their_ranges(tmp_path):
    listing = tmp_path / "req.txt"
    listing.write_text("# a comment # runtime >=9\n"
                       "alpha==1.2.3   # runtime >=1.0\n"
                       "beta[x]==2.0   # runtime: extra-b >=2,<3\n"
                       "gamma==0.1\n"
                       "delta==4.0    # built without isolation\n")
    assert backend.runtime_requirements(str(listing)) == {None: ["alpha>=1.0"], "extra-b": ["beta>=2,<3"]}


def test_a_runtime_line_without_a_range_is_an_error_naming_the_line(tmp_path):
    listing = tmp_path / "req.txt"
    listing.write_text("alpha==1.2.3\nbeta==2.0  # runtime\n")
    with pytest.raises(RuntimeError, match=r"req.txt:2: '# runtime' on beta needs the range"):
        backend.runtime_requirements(str(listing))


def test_the_wheel_metadata_is_the_pinned_lists_runtime_lines():
    deps = backend.runtime_requirements()
    pins = _pins(backend.REQUIREMENTS)
    # numpy is the package's dependency, torch its extra "torch"; each range admits the pinned
    # (tested) version
    assert [d.split(">=")[0] for d in deps[None]] == ["numpy"]
    assert [d.split(">=")[0] for d in deps["torch"]] == ["torch"]
    for reqs in deps.values():
        for req in reqs:
            name, floor = req.split(">=")
            tested = tuple(int(x) for x in pins[name].split(".")[:2])
            assert tuple(int(x) for x in floor.split(".")[:2]) <= tested, (req, pins[name])
    metadata = backend._metadata()
    for req in deps[None]:
        assert "Requires-Dist: %s\n" % req in metadata
    assert 'Requires-Dist: %s; extra == "torch"\n' % deps["torch"][0] in metadata
