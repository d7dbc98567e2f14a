"""The one table (issue 35): SemsoftConfig's field metadata generates the CLI flags of
``semsoft classify``, ``eval`` and ``tune``, the HTTP keys and their rules, and the config
file's fields; an old name is refused with the new one on each."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from semsoft_plugin.app.cli import build_parser, main
from semsoft_plugin.core import request as sreq
from semsoft_plugin.core.config import RENAMED, SemsoftConfig, config_field_specs

FIELDS = [f.name for f in dataclasses.fields(SemsoftConfig)]
# One value of each kind a flag reads, as typed on a command line (and parsed).
TYPED = {bool: ("false", False), int: ("7", 7), float: ("0.5", 0.5)}


def _subparser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(load=command if command != "classify" else None)
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[command]


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The config-field flags a parser shows (the hidden old names left out)."""
    shown = {
        option
        for action in parser._actions
        if action.help is not argparse.SUPPRESS
        for option in action.option_strings
    }
    return {f[2:].replace("-", "_") for f in shown} & {*FIELDS, *RENAMED}


@pytest.mark.parametrize("command", ["classify", "eval", "tune"])
def test_cli_flags_are_the_config_fields(command):
    parser = _subparser(command)
    want = set(FIELDS) - ({"score_temperature"} if command == "tune" else set())
    assert _flags(parser) == want  # tune fits the score temperature: no grid axis
    for name in want:
        spec = config_field_specs()[name]
        text, value = ("shared", "shared") if name == "vote" else TYPED[spec["kind"]]
        args = parser.parse_args(["--labels", "a,b", f"--{name.replace('_', '-')}", text])
        assert getattr(args, name) == (value if command != "tune" else (value,))


def test_http_keys_and_the_config_file_are_the_config_fields():
    keys = {k[len("semsoft_") :] for k in sreq._CONFIG_KEYS}
    assert keys == set(FIELDS) == set(SemsoftConfig().to_dict())
    rules = sreq.config_rules()
    for name, spec in config_field_specs().items():
        assert spec["help"] and spec["rule"]
        if name != "k":  # the server bounds k tighter (SERVER_MAX_K)
            assert rules[name] == spec["rule"]
    # Every field is sent and parsed back over HTTP (the values of a non-default config).
    config = SemsoftConfig(k=9, tau=0.1, center=False, own_vote=False, vote="per_label",
                           score_temperature=2.0, semantic_weight=0.5,
                           silent_vote=0.2)  # fmt: skip
    extra = sreq.SemsoftRequest(("a", "b"), config).to_extra_args()
    assert {k for k in extra if k.startswith("semsoft_")} >= set(sreq._CONFIG_KEYS) - {
        "semsoft_tau_quantile"  # None: not sent
    }
    parsed = sreq.parse_request(extra)
    assert parsed is not None and parsed.config == config


@pytest.mark.parametrize("command", ["classify", "eval", "tune"])
def test_preset_is_the_base_and_flags_override_it(command):
    from semsoft_plugin.app.config_args import config_from_args, start_from_args

    parser = _subparser(command)
    args = parser.parse_args(["--labels", "a,b", "--preset", "paper", "--k", "9"])
    if command == "tune":
        assert start_from_args(args) == SemsoftConfig.preset("paper")
        assert args.k == (9,)
    else:
        assert config_from_args(args) == SemsoftConfig.preset("paper").replace(k=9)
    with pytest.raises(SystemExit):
        parser.parse_args(["--labels", "a,b", "--preset", "papr"])


def test_tau_quantile_none_resets_a_config_file(tmp_path):
    from semsoft_plugin.app.config_args import config_from_args

    path = tmp_path / "c.json"
    SemsoftConfig(tau_quantile=0.9, semantic_weight=1.0).save(path)
    parser = _subparser("eval")
    args = parser.parse_args(["--config", str(path), "--tau-quantile", "none", "--tau", "0.2"])
    assert config_from_args(args) == SemsoftConfig(tau=0.2, semantic_weight=1.0)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_old_flags_are_refused_with_the_new_one(old, capsys):
    flag = "--" + old.replace("_", "-")
    with pytest.raises(SystemExit) as exit_info:
        main(["classify", "x", "--labels", "a,b", flag, "1"])
    assert exit_info.value.code == 2
    new = RENAMED[old].replace("_", "-")
    assert f"{flag}: renamed: use --{new}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tau", "0.1"], "tau=0.1 has no effect at semantic_weight=0"),
        (["--preset", "paper", "--semantic-weight", "0"], "vote='per_label' has no effect"),
        (["--preset", "pooled", "--config", "c.json"], "--preset pooled and --config c.json"),
    ],
)
def test_refused_settings_are_one_line_before_any_model_loads(argv, message, capsys):
    assert main(["classify", "x", "--labels", "a,b", "--model", "/no/such/model", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_a_config_file_with_an_old_name_is_refused_on_the_cli(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"k": 20, "temperature": 1.5}))
    assert main(["classify", "x", "--labels", "a,b", "--config", str(path)]) == 2
    assert "temperature: renamed: use score_temperature" in capsys.readouterr().err
