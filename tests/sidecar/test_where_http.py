"""``GET /where``: the sidecar answers ``kafka-cleaner where`` for its broker's disk (the
operator's ``where`` asks every broker's sidecar). The answer is the CLI's, byte for byte in
its JSON rows, for the same log dir and clock; a bad question is a 400 that says which
parameter and why; a second question while one reads is a 429; nothing is answered before
the sidecar has a policy."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from click.testing import CliRunner
from sidecar_helpers import http_get, new_sidecar, write_policy

from cleaner.records.columns import decode_records
from cleaner.sidecar.where_http import MAX_KEY_BYTES
from cleaner.storage.segment import iter_file_batches
from cleaner.where import where_command

TOPIC = "topic-0"


def _keys_on_disk(log_dir: Path) -> list[bytes]:
    keys = set()
    for segment in sorted((log_dir / f"{TOPIC}-1").glob("*.log")):
        for batches in iter_file_batches(segment):
            data = batches.select(batches.is_v2 & ~batches.is_control)
            if len(data):
                cols = decode_records(data)
                keys |= {cols.key(i) for i in range(len(cols))} - {None}
    return sorted(keys)


def test_the_sidecar_answers_where_as_the_cli_does(tmp_path: Path, make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=2, tombstones=0.2)
    policy_path = tmp_path / "policy.yaml"
    sc = new_sidecar(policy_path, [data])
    host, port = sc.serve()
    url = f"http://{host}:{port}/where"
    try:
        code, body, _ = http_get(f"{url}?topic={TOPIC}&key-hex=6b")
        assert code == 503 and b"no policy" in body  # before the first policy

        write_policy(policy_path)
        sc.tick()
        now = sc.time.milliseconds()
        for key in _keys_on_disk(data)[:5]:
            code, body, ctype = http_get(f"{url}?topic={TOPIC}&key-hex={key.hex()}&partition=1")
            assert code == 200 and ctype == "application/json", body
            answer = json.loads(body)
            cli = CliRunner().invoke(where_command, [str(data), "--topic", TOPIC, "--key-hex", key.hex(),
                                                     "--partition", "1", "--now-ms", str(now), "-o", "json"])
            assert cli.exit_code == 0, cli.output
            assert answer["sightings"] == json.loads(cli.stdout) and answer["sightings"], key
            assert answer["version"] == 1 and answer["topic"] == TOPIC

        # The partition count from the question (no metadata log in a generated dir).
        key = _keys_on_disk(data)[0]
        code, body, _ = http_get(f"{url}?topic={TOPIC}&key-hex={key.hex()}&partitions=2")
        assert code == 200 and any("Kafka's default partitioner" in n for n in json.loads(body)["notes"])
        code, body, _ = http_get(f"{url}?topic=no-such-topic&key-hex=6b&partition=0")
        assert code == 200 and json.loads(body)["sightings"] == []
        assert "holds no replica" in json.loads(body)["notes"][0]
    finally:
        sc.stop()


def test_a_bad_question_is_a_400_that_says_why_and_one_question_reads_at_a_time(tmp_path: Path,
                                                                                 make_log_dir) -> None:
    data = make_log_dir(topics=1, partitions=2)
    policy_path = write_policy(tmp_path / "policy.yaml")
    sc = new_sidecar(policy_path, [data])
    host, port = sc.serve()
    url = f"http://{host}:{port}/where"
    try:
        sc.tick()
        for query, says in [
            ("key-hex=6b&partition=0", "topic is required"),
            (f"topic={TOPIC}&partition=0", "key-hex is required"),
            (f"topic={TOPIC}&key-hex=zz&partition=0", "key-hex is not hexadecimal"),
            (f"topic={TOPIC}&key-hex={'00' * (MAX_KEY_BYTES + 1)}", f"at most {MAX_KEY_BYTES:,}"),
            (f"topic={TOPIC}&key-hex=6b&partition=-1", "partition is -1; at least 0"),
            (f"topic={TOPIC}&key-hex=6b&partitions=two", "partitions is not a whole number"),
            (f"topic={TOPIC}&topic=x&key-hex=6b", "topic given 2 times"),
            (f"topic={TOPIC}&key=k", "unknown parameter(s) key"),
            (f"topic={TOPIC}&key-hex=6b", "--partitions N or --partition P"),  # the CLI's own words
        ]:
            code, body, _ = http_get(f"{url}?{query}")
            assert code == 400 and says in json.loads(body)["error"], (query, body)

        assert sc.where._reading.acquire(timeout=5)  # a question reading the disk
        try:
            code, body, _ = http_get(f"{url}?topic={TOPIC}&key-hex=6b&partition=0")
            assert code == 429 and "another where" in json.loads(body)["error"]
        finally:
            sc.where._reading.release()
        answers: list[int] = []
        threads = [threading.Thread(target=lambda: answers.append(
            http_get(f"{url}?topic={TOPIC}&key-hex=6b&partition=0")[0])) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(answers) <= {200, 429} and 200 in answers, answers
    finally:
        sc.stop()
