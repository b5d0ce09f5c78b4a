"""File names of saved states (rwkv7_apps.states.state_file_name): safe for any request id,
and distinct for distinct ids."""
import numpy as np

from rwkv7_apps.states import state_file_name


def test_any_id_gives_a_safe_distinct_file_name(tmp_path):
    rng = np.random.default_rng()
    alphabet = list("ab/._-: \\\x00ü😀\n*?") + ["..", "../", "CON"]
    ids = ["../../etc/passwd", "/abs", ".hidden", "-dash", "a" * 300, "ü" * 200, "a/b", "a_b", 0, 12, "x" * 100,
           *("".join(rng.choice(alphabet, int(rng.integers(1, 12)))) for _ in range(200))]
    names = {}
    for i in ids:
        name = state_file_name(i)
        assert "/" not in name and "\x00" not in name and not name.startswith((".", "-"))
        assert name.endswith(".safetensors") and len(name.encode()) <= 255
        names.setdefault(name, set()).add(str(i))
        (tmp_path / name).write_bytes(b"")  # the file system takes it, inside the directory
    assert all(len(v) == 1 for v in names.values())  # distinct ids (as text) never share a name
    assert state_file_name("plain-id_1.v2") == "plain-id_1.v2.safetensors"
    assert state_file_name(7) == "7.safetensors"
    assert len(list(tmp_path.iterdir())) == len(names)
