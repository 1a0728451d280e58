"""TOML node configuration: round trip, and clear errors that name the bad key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent import config as cfg
from gentorrent.settings import COMMON_SECTIONS, ConfigError, load, parse, render


def test_defaults_round_trip_through_rendered_file(tmp_path):
    path = tmp_path / "config.toml"
    defaults = {name: cls() for name, cls in COMMON_SECTIONS.items()}
    path.write_text(render(defaults))
    assert load(path) == defaults


def test_values_override_defaults_and_ints_widen_to_float(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[routing]\ngossip_interval_s = 2\n[cloves]\nn = 6\nk = 4\n")
    loaded = load(path)
    assert loaded["routing"].gossip_interval_s == 2.0
    assert (loaded["cloves"].n, loaded["cloves"].k) == (6, 4)
    assert loaded["reputation"] == cfg.ReputationParams()


def test_typo_in_key_names_the_key_and_suggests_the_right_one(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[routing]\ngossip_intervl_s = 5.0\n")
    with pytest.raises(ConfigError) as err:
        load(path)
    assert "routing.gossip_intervl_s" in str(err.value)
    assert "gossip_interval_s" in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_section_wrong_type_and_bad_toml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[routng\].*routing"):
        parse({"routng": {}}, COMMON_SECTIONS)
    with pytest.raises(ConfigError, match=r"cloves.n: expected int, got str"):
        parse({"cloves": {"n": "4"}}, COMMON_SECTIONS)
    path = tmp_path / "config.toml"
    path.write_text("[cloves\nn=4")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.text(max_size=8), st.integers() | st.text() | st.floats(allow_nan=False) | st.booleans(), max_size=3), max_size=3))
def test_arbitrary_documents_either_parse_or_raise_config_error(doc):
    try:
        parse(doc, COMMON_SECTIONS)
    except ConfigError:
        pass
