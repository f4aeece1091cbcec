"""Model and host files (DESIGN.md §15): the shipped ones say what the design says, every key carries its
source, and every mistake in a file is a ConfigError naming the key and the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import kbwork

from kbwork import ConfigError
from kbwork.model import Host, Model, load_host, load_model
from kbwork.model.files import HOST_KEYS, HOSTS_DIR, MODEL_KEYS, MODELS_DIR


def test_the_llama_3_models_are_the_design_s():
    m8, m70 = load_model("llama-3-8b"), load_model("llama-3-70b")
    assert m8.to_dict() == dict(name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                                ffn=14336, vocab=128256, weight_dtype="bf16", kv_dtype="bf16")  # §17: bf16 as released
    assert m70.to_dict() == dict(name="llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                                 ffn=28672, vocab=128256, weight_dtype="bf16", kv_dtype="bf16")
    assert (m8.group, m70.group) == (4, 8)
    assert repr(m70) == ("Model('llama-3-70b': 80 layers, hidden 8192, 64 heads / 8 KV heads x 128, FFN 28672, "
                         "vocab 128256)")
    assert load_model(MODELS_DIR / "llama-3-8b.toml") == m8 and load_model(m8) is m8
    with pytest.raises(AttributeError):
        m8.layers = 1  # frozen


def test_the_h200_host_is_the_design_s():
    h = load_host()
    assert h.to_dict() == dict(name="h200", peak_tflops_bf16=989.0, peak_tflops_fp8=1979.0, hbm_tb_s=4.8, eta_flops=0.8, eta_bw=0.86,
                               launch_us=0.53, handoff_us=2.0, gpu_hbm_gib=139.0,
                               attention_bandwidth="h200_decode_attention_bandwidth.csv",
                               # DESIGN §18's energy keys
                               gpu_hbm_pj_per_bit=3.59, flop_pj=0.16, idle_w=80.0, busy_w=350.0, link_pj_per_bit=0.3)
    assert load_host("h200") == h and load_host(h) is h
    assert (h.peak_flops, h.hbm_bytes_per_s, h.launch_s, h.handoff_s) == (989e12, 4.8e12, 0.53e-6, 2e-6)
    assert "handoff 2 us" in repr(h)
    over = load_host({"handoff_us": 5, "eta_bw": 0.9})
    assert (over.handoff_us, over.eta_bw, over.hbm_tb_s) == (5.0, 0.9, 4.8)
    assert load_host({"handoff_us": 0, "launch_us": 0}).handoff_s == 0  # the free ends of a sweep


@pytest.mark.parametrize("path", sorted(MODELS_DIR.glob("*.toml")) + sorted(HOSTS_DIR.glob("*.toml")),
                         ids=lambda p: p.name)
def test_every_key_of_a_shipped_file_says_where_it_comes_from(path: Path):
    keys = MODEL_KEYS if path.parent == MODELS_DIR else HOST_KEYS
    lines = path.read_text(encoding="utf-8").splitlines()
    for key in keys[1:]:
        line = next(x for x in lines if re.match(rf"{key}\s*=", x))
        assert "#" in line and line.split("#", 1)[1].strip(), f"{path.name}: {key} has no comment"
    text = path.read_text(encoding="utf-8")
    if path.parent == HOSTS_DIR:  # each key a published spec, a measurement or an assumption
        for key in keys[1:]:
            comment = next(x for x in lines if re.match(rf"{key}\s*=", x)).split("#", 1)[1]
            assert re.search(r"published|measured|assumption", comment), f"{key}: {comment}"
    else:
        assert "config.json" in text


def _write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


GOOD = 'name = "t"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nhead_dim = 16\nffn = 128\nvocab = 100\n'


@pytest.mark.parametrize("change, match", [
    (("layers = 2", "layres = 2"), r"unknown model key 'layres'.*Did you mean 'layers'"),
    (("vocab = 100\n", ""), r"model key 'vocab' missing"),
    (("hidden = 64", 'hidden = "64"'), r"'hidden' must be a positive integer, got the string '64'"),
    (("ffn = 128", "ffn = 12.5"), r"'ffn' must be a positive integer, got 12.5"),
    (("heads = 4", "heads = true"), r"'heads' must be a positive integer, got True"),
    (("layers = 2", "layers = 0"), r"'layers' is 0; it must be a positive integer"),
    (("head_dim = 16", "head_dim = -16"), r"'head_dim' is -16"),
    (("heads = 4", "heads = 5"), r"'heads' \(5\) is not a multiple of 'kv_heads' \(2\)"),
    (('name = "t"', "name = 3"), r"'name' must be a non-empty string"),
    (("vocab = 100", "vocab = 100\n[extra]\nx = 1"), r"\[extra\] is a section"),
    (("vocab = 100", "vocab = = 100"), r"not valid TOML"),
])
def test_a_bad_model_file_is_a_config_error_naming_the_key_and_the_file(tmp_path, change, match):
    p = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError, match=match) as exc:
        load_model(p)
    assert str(p) in str(exc.value)
    assert load_model(_write(tmp_path, GOOD, "ok.toml")).layers == 2


def test_an_unknown_model_or_a_bad_argument_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model 'llama-4' not found .*Known models: llama-3-70b, llama-3-8b"):
        load_model("llama-4")
    with pytest.raises(ConfigError, match=r"llama-3-8b \(did you mean 'llama-3-8b'\?\); or pass"):
        load_model("LLAMA3-8b")  # a misspelt built-in name: the closest is named
    with pytest.raises(ConfigError, match=r"Known models: llama-3-70b, llama-3-8b; or pass"):
        load_model("zzz")        # nothing close: no guess
    with pytest.raises(ConfigError, match=r"Known models: llama-3-70b, llama-3-8b; or pass"):
        load_model(str(MODELS_DIR / "llama3-8b.toml"))  # a path names a file, not a built-in: no guess
    with pytest.raises(ConfigError, match="model must be a name"):
        load_model(8)
    with pytest.raises(ConfigError, match="model name is empty"):
        load_model("")
    with pytest.raises(ConfigError, match="is a directory"):
        load_model(MODELS_DIR)
    m = load_model("llama-3-8b")
    assert m.replace(layers=3).layers == 3
    with pytest.raises(ConfigError, match=r"unknown model key 'layer'.*Did you mean 'layers'"):
        m.replace(layer=3)
    with pytest.raises(ConfigError, match="'kv_heads' \\(5\\)"):
        m.replace(kv_heads=5)


@pytest.mark.parametrize("over, match", [
    ({"handof_us": 1}, r"unknown host key 'handof_us'.*Did you mean 'handoff_us'"),
    ({"hbm_tb_s": 0}, r"'hbm_tb_s' is 0.0; it must be positive"),
    ({"peak_tflops_bf16": -1}, r"'peak_tflops_bf16' is -1.0; it must be positive"),
    ({"handoff_us": -1}, r"'handoff_us' is -1.0; it must be non-negative"),
    ({"eta_bw": 1.2}, r"'eta_bw' is 1.2; it is a fraction of peak, at most 1"),
    ({"eta_flops": "0.8"}, r"'eta_flops' must be a finite number, got the string"),
    ({"launch_us": True}, r"'launch_us' must be a finite number, got True"),
    ({"hbm_tb_s": float("inf")}, r"'hbm_tb_s' must be a finite number"),
])
def test_a_bad_host_key_is_a_config_error_naming_it(over, match):
    with pytest.raises(ConfigError, match=match):
        load_host(over)


def test_a_host_file_needs_every_key_and_names_itself(tmp_path):
    text = (HOSTS_DIR / "h200.toml").read_text()
    p = _write(tmp_path, text.replace('name = "h200"', 'name = "b"'), "b.toml")
    assert load_host(p).name == "b"
    p = _write(tmp_path, "\n".join(x for x in text.splitlines() if not x.startswith("eta_bw")), "c.toml")
    with pytest.raises(ConfigError, match=r"c.toml: host key 'eta_bw' missing"):
        load_host(p)
    p = _write(tmp_path, text + "peak_tflops = 1\n", "d.toml")
    with pytest.raises(ConfigError, match=r"d.toml: unknown host key 'peak_tflops'.*Did you mean 'peak_tflops_bf16'"):
        load_host(p)
    with pytest.raises(ConfigError, match=r"host 'h100' not found .*Known hosts: h200"):
        load_host("h100")
    with pytest.raises(ConfigError, match="host must be a name"):
        load_host(3.5)
    assert isinstance(load_host(None), Host) and isinstance(load_model("llama-3-8b"), Model)


DOC = Path(__file__).resolve().parent.parent / "docs" / "model.md"


def _doc_rows(key: str, section: str) -> list[list[str]]:
    """The table rows of ``key`` in the section of docs/model.md whose heading starts with ``section``."""
    text = DOC.read_text(encoding="utf-8").split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith(f"| `{key}` |")]


@pytest.mark.parametrize("key", MODEL_KEYS)
def test_docs_give_every_model_key_with_both_models_values(key):
    (row,) = _doc_rows(key, "Model keys")
    m8, m70 = load_model("llama-3-8b"), load_model("llama-3-70b")
    assert row[1].strip("`") == str(getattr(m8, key)) and row[2].strip("`") == str(getattr(m70, key))


@pytest.mark.parametrize("key", HOST_KEYS)
def test_docs_give_every_host_key_with_its_value_and_source(key):
    (row,) = _doc_rows(key, "Host keys")
    value = getattr(load_host(), key)
    assert row[1].strip("`") == value if isinstance(value, str) else float(row[1]) == value
    if key != "name":
        assert re.search(r"published|measured|assumption", row[3]), row


def test_docs_give_every_device_key():
    from kbwork.model.device import DEVICE_KEYS

    device = kbwork.load_topology("ahbm-device-v1")
    for key in DEVICE_KEYS:
        (row,) = _doc_rows(key, "Device keys")
        assert float(row[1]) == getattr(device, key)
