"""TOML node configuration: round trip, and clear errors that name the bad key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent import config as cfg
from gentorrent.settings import MODEL, READERS, SECTIONS, USER, ConfigError, load, parse, render


def test_defaults_round_trip_through_rendered_file(tmp_path):
    path = tmp_path / "config.toml"
    defaults = {name: cls() for name, cls in SECTIONS.items()}
    path.write_text(render(defaults))
    assert load(path, SECTIONS) == defaults


def test_values_override_defaults_and_ints_widen_to_float(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[routing]\ngossip_interval_s = 2\n[cloves]\nn = 6\nk = 4\n")
    loaded = load(path, SECTIONS)
    assert loaded["routing"].gossip_interval_s == 2.0
    assert (loaded["cloves"].n, loaded["cloves"].k) == (6, 4)
    assert loaded["reputation"] == cfg.ReputationParams()


def test_typo_in_key_names_the_key_and_suggests_the_right_one(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[routing]\ngossip_intervl_s = 5.0\n")
    with pytest.raises(ConfigError) as err:
        load(path, SECTIONS)
    assert "routing.gossip_intervl_s" in str(err.value)
    assert "gossip_interval_s" in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_section_wrong_type_and_bad_toml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[routng\].*routing"):
        parse({"routng": {}}, SECTIONS)
    with pytest.raises(ConfigError, match=r"cloves.n: expected int, got str"):
        parse({"cloves": {"n": "4"}}, SECTIONS)
    path = tmp_path / "config.toml"
    path.write_text("[cloves\nn=4")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(path, SECTIONS)
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.toml", SECTIONS)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.text(max_size=8), st.integers() | st.text() | st.floats(allow_nan=False) | st.booleans(), max_size=3), max_size=3))
def test_arbitrary_documents_either_parse_or_raise_config_error(doc):
    try:
        parse(doc, SECTIONS)
    except ConfigError:
        pass


# --------------------------------------------------------------------------- what each role reads


@pytest.mark.parametrize("schema,section,says", [
    (USER, "routing", "[routing] is not read by gt-user: gt-model reads it"),
    (USER, "model_node", "[model_node] is not read by gt-user: gt-model reads it"),
    (MODEL, "user_api", "[user_api] is not read by gt-model: gt-user reads it"),
    (MODEL, "audits", "[audits] is not read by gt-model: gt-user reads it"),
    (USER, "epochs", "its genesis sets it (app_state.epochs"),
    (MODEL, "reputation", "its genesis sets it (app_state.reputation"),
    (USER, "consensus", "gt-verifier reads its timeouts from its home's config.json"),
    (MODEL, "wire", "no node sets it"),
])
def test_a_section_a_role_does_not_apply_is_refused_naming_who_reads_it(schema, section, says):
    """The sections used to be accepted, validated and then ignored: a node's config.toml could
    set [epochs] or [routing] on a user node and nothing changed."""
    with pytest.raises(ConfigError) as err:
        parse({section: {}}, schema, "home/config.toml")
    assert says in str(err.value) and str(err.value).startswith("home/config.toml: ")
    assert "\n" not in str(err.value)


def test_every_section_is_applied_by_a_role_or_refused_by_all_of_them():
    applied = set(USER.sections) | set(MODEL.sections)
    for section in SECTIONS:
        if section not in applied:
            assert "gt-user" not in READERS[section] and "gt-model" not in READERS[section], section
    assert applied | {"epochs", "reputation", "consensus", "wire"} == set(SECTIONS)
    for schema in (USER, MODEL):  # each role gets every section it applies, at its defaults when absent
        assert set(parse({}, schema)) == set(schema.sections)


def test_a_typo_of_a_section_another_role_reads_still_suggests_it():
    with pytest.raises(ConfigError, match=r"unknown section \[routng\].*'routing'"):
        parse({"routng": {}}, USER)


def test_gt_model_applies_each_section_it_reads(tmp_path):
    """What `gt-model serve` hands its engine, forwarding, gossip and clove intake."""
    from model_node.cli import build_parser, load_config

    (tmp_path / "config.toml").write_text("[model_node]\nmax_queued_requests = 7\n[routing]\ngossip_interval_s = 2.5\n"
                                          "[cloves]\nk = 2\n[overlay]\nreassembly_timeout_s = 9.0\n")
    conf = load_config(tmp_path, build_parser().parse_args(["serve", "--gpu-memory-utilization", "0.6"]))
    assert conf["model_node"].max_queued_requests == 7 and conf["model_node"].gpu_memory_utilization == 0.6
    assert conf["routing"].gossip_interval_s == 2.5
    assert conf["cloves"].k == 2 and conf["overlay"].reassembly_timeout_s == 9.0


@pytest.mark.parametrize("argv,config,says", [
    (["user_client.cli", "start"], "[epochs]\nscore_tolerance = 0.3\n", "[epochs] is not read by gt-user"),
    (["model_node.cli", "serve", "--listen", "127.0.0.1:0"], "[user_api]\nmax_tokens = 9\n",
     "[user_api] is not read by gt-model: gt-user reads it"),
])
def test_the_commands_refuse_such_a_section_in_one_line_before_starting(tmp_path, argv, config, says):
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "config.toml").write_text(config)
    (tmp_path / "directory.json").write_text('{"users": [], "models": []}')
    out = subprocess.run([sys.executable, "-m", *argv, "--home", str(tmp_path), "--directory",
                          str(tmp_path / "directory.json")], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "node.json").exists()
