"""A throw-away SSH/SFTP server on loopback for DVC's ssh remote (tests and benchmarks/bench_remote.py).

asyncssh (the library dvc-ssh itself talks through) serves SFTP over a real SSH connection:
a fresh ed25519 host key and a fresh client key, public-key authentication only, 127.0.0.1 on
a free port. ``home`` gets ``.ssh/known_hosts`` naming the server's host key, so the client
checks it as it would any server's (point HOME there).
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def sftp_server(home: Path) -> Iterator[dict]:
    """Serve SFTP until the block ends; yields {"port", "keyfile", "url_prefix"}."""
    import asyncssh

    home.mkdir(parents=True, exist_ok=True)
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    keyfile = home / ".ssh" / "id_encmap_test"
    keyfile.write_bytes(client_key.export_private_key())
    keyfile.chmod(0o600)
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized,
        sftp_factory=True, allow_scp=False, password_auth=False, kbdint_auth=False))
    port = server.sockets[0].getsockname()[1]
    (home / ".ssh" / "known_hosts").write_text(
        f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}\n")
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield {"port": port, "keyfile": str(keyfile), "url_prefix": f"ssh://encmap@127.0.0.1:{port}"}
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
