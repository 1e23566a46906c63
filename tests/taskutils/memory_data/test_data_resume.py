"""Streaming outputs: a killed run (simulated by a truncated partial file) resumes without duplicates or
truncation, a complete file is not redone, and a folder holding another configuration is refused."""

import json

import pyarrow.parquet as pq
import pytest

from taskutils.memory_data import stages
from taskutils.memory_data.output import MANIFEST_NAME, ConfigMismatchError, ResumableJsonl
from taskutils.memory_data.ruler import Sources


def _kill_after(partial_source: bytes, lines: int, extra_bytes: int) -> bytes:
    """The bytes a run killed while writing line ``lines + 1`` leaves: whole lines, then a cut line."""
    rows = partial_source.split(b"\n")
    kept = b"\n".join(rows[:lines]) + b"\n"
    return kept + rows[lines][:extra_bytes]


def test_killed_ruler_run_resumes_to_the_same_file(tmp_path, tiny_tokenizer, sources):
    src = Sources(essay=sources["essay"])
    full = stages.ruler(tmp_path / "full", "niah_single_2", 4096, tiny_tokenizer, "tiny", 5, 42, src, progress=False)
    reference = full.output.read_bytes()

    folder = tmp_path / "killed"
    # The first run registered itself and wrote 2 lines and part of the 3rd when it was killed.
    stages.ruler(folder, "niah_single_2", 4096, tiny_tokenizer, "tiny", 5, 42, src, progress=False)
    final = folder / "eval_niah_single_2_4096.jsonl"
    final.rename(folder / "eval_niah_single_2_4096.jsonl.partial")
    (folder / "eval_niah_single_2_4096.jsonl.partial").write_bytes(_kill_after(reference, 2, 100))
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"]["eval_niah_single_2_4096.jsonl"]["status"] = "partial"
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))

    stages.ruler(folder, "niah_single_2", 4096, tiny_tokenizer, "tiny", 5, 42, src, progress=False)
    assert final.read_bytes() == reference
    assert not (folder / "eval_niah_single_2_4096.jsonl.partial").exists()
    assert [json.loads(line)["index"] for line in final.read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_resumable_writer_drops_a_corrupt_last_line(tmp_path):
    config = {"stage": "t", "seed": 1}
    writer = ResumableJsonl(tmp_path, "x.jsonl", config, ("seed",), total=4)
    (tmp_path / "x.jsonl.partial").write_text('{"index": 0}\n{"index": 1}\n{"index": 2, "cut\n')
    writer = ResumableJsonl(tmp_path, "x.jsonl", config, ("seed",), total=4)
    assert writer.start == 2  # a newline-terminated but unparseable line is dropped too
    with writer:
        for i in range(writer.start, 4):
            writer.write({"index": i})
    assert [json.loads(x)["index"] for x in (tmp_path / "x.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert ResumableJsonl(tmp_path, "x.jsonl", config, ("seed",), total=4).done


def test_killed_parquet_run_resumes(tmp_path, sources):
    ref = stages.hotpotqa_process(tmp_path / "ref", "dev", sources["hotpotqa_dev"], 9, 30).output
    folder = tmp_path / "killed"
    stages.hotpotqa_process(folder, "dev", sources["hotpotqa_dev"], 9, 30)
    # Rebuild the partial JSON lines of a run killed at row 4 from the finished rows.
    rows = pq.read_table(folder / "hotpotqa_dev_process.parquet").to_pylist()
    lines = "".join(json.dumps(r) + "\n" for r in rows[:4]) + json.dumps(rows[4])[:50]
    (folder / "hotpotqa_dev_process.parquet").unlink()
    (folder / "hotpotqa_dev_process.parquet.partial").write_text(lines)
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    manifest["files"]["hotpotqa_dev_process.parquet"]["status"] = "partial"
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
    stages.hotpotqa_process(folder, "dev", sources["hotpotqa_dev"], 9, 30)
    assert pq.read_table(folder / "hotpotqa_dev_process.parquet").equals(pq.read_table(ref))


def test_complete_outputs_are_not_regenerated(tmp_path, tiny_tokenizer):
    first = stages.ruler(tmp_path, "vt", 4096, tiny_tokenizer, "tiny", 2, 42, progress=False).output
    stamp = first.stat().st_mtime_ns
    stages.ruler(tmp_path, "vt", 4096, tiny_tokenizer, "tiny", 2, 42, progress=False)
    assert first.stat().st_mtime_ns == stamp
    first.unlink()
    with pytest.raises(ConfigMismatchError, match="missing"):
        stages.ruler(tmp_path, "vt", 4096, tiny_tokenizer, "tiny", 2, 42, progress=False)


def test_a_folder_with_another_configuration_is_refused(tmp_path, tiny_tokenizer, sources):
    stages.ruler(tmp_path, "vt", 4096, tiny_tokenizer, "tiny", 2, 42, progress=False)
    with pytest.raises(ConfigMismatchError, match="num_samples"):  # same file, other sample count
        stages.ruler(tmp_path, "vt", 4096, tiny_tokenizer, "tiny", 3, 42, progress=False)
    with pytest.raises(ConfigMismatchError, match="seed=7"):  # another file, but another seed: no mixing
        stages.ruler(tmp_path, "fwe", 4096, tiny_tokenizer, "tiny", 2, 7, progress=False)
    from taskutils.memory_data.tokenizer import tiktoken_to_fast

    other = tiktoken_to_fast({bytes([b]): b for b in range(256)}, special_tokens=[])
    with pytest.raises(ConfigMismatchError, match="tokenizer"):
        stages.ruler(tmp_path, "fwe", 4096, other, "bytes", 2, 42, progress=False)
    assert not (tmp_path / "eval_fwe_4096.jsonl.partial").exists()
    # HotpotQA sets in the same folder are another stage: allowed alongside; their own seed must agree.
    stages.hotpotqa_eval(tmp_path, sources["hotpotqa_dev"], [0, 1], [20], seed=42)
    with pytest.raises(ConfigMismatchError, match="seed"):
        stages.hotpotqa_eval(tmp_path, sources["hotpotqa_dev"], [0, 1], [30], seed=43)
