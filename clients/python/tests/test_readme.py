"""The first example of README.md runs as written against the cluster (only
its endpoints replaced), and prints what its comments say."""

import contextlib
import io
import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
ENDPOINTS = '["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]'


def test_the_readme_example_runs(cluster):
    text = open(README).read()
    example = re.search(r"## A first example\s+```python\n(.*?)```", text, re.S).group(1)
    assert ENDPOINTS in example
    assert len(example.strip().splitlines()) <= 16
    example = example.replace(ENDPOINTS, repr(cluster.endpoints))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, "README.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert lines[0] == "5 5"
    assert lines[1] == "Incremented(value=10) False"
    first, replay = re.fullmatch(r"(\{.*\}) (\{.*\})", lines[2]).groups()
    assert first == replay and first.startswith("{'order': 42, 'fence': ")
