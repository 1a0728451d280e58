"""Property tests of the TOML config parser under hostile input (oracle: testkit/fuzzing/settings.py)."""

from __future__ import annotations

import tomllib

from hypothesis import given, settings, strategies as st

from gentorrent import settings as cfgfile
from testkit.fuzzing import filtered_check

check = filtered_check("settings")


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=400))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_files_raise_only_config_error(text: str, tmp_path_factory) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        result = cfgfile.load(path, cfgfile.SECTIONS)
    except cfgfile.ConfigError:
        return
    assert set(result) == set(cfgfile.SECTIONS)


_scalars = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.booleans(),
                     st.text(max_size=5))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(cfgfile.SECTIONS) + ["nope"]),
                       st.one_of(_scalars, st.dictionaries(st.text(max_size=24), st.one_of(_scalars, st.lists(_scalars, max_size=3)), max_size=4)),
                       max_size=4))
def test_arbitrary_documents_raise_only_config_error(doc) -> None:
    try:
        result = cfgfile.parse(doc, cfgfile.SECTIONS)
    except cfgfile.ConfigError:
        return
    for name, cls in cfgfile.SECTIONS.items():
        assert type(result[name]) is cls


def test_render_round_trips_strings_with_control_characters() -> None:
    result = cfgfile.parse({"model_node": {"default_model": "a\nb"}}, cfgfile.SECTIONS)
    again = cfgfile.parse(tomllib.loads(cfgfile.render(result)), cfgfile.SECTIONS)
    assert again["model_node"].default_model == "a\nb"
