"""The build context exactly as the docker CLI packs it (with .dockerignore), caught by a stand-in daemon on a Unix
socket: the classic builder (DOCKER_BUILDKIT=0) packs the context in the CLI and posts it to /build; BuildKit applies
the same .dockerignore rules. No daemon runs and nothing is built."""

import http.server
import io
import json
import os
import shutil
import socketserver
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


class ContextCatcher(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A stand-in Docker daemon: answers the CLI's ping, keeps the file names of the build context it is sent, and
    fails the build."""

    daemon_threads = True

    def __init__(self, path: Path):
        self.files: list[str] = []
        super().__init__(str(path), ContextRequest)

    def get_request(self):
        request, _ = super().get_request()
        return request, ("docker-cli", 0)  # a Unix socket's peer has no address; http.server logs one


class ContextRequest(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:
        self.reply(b"")

    def do_GET(self) -> None:
        self.reply(b"OK")

    def do_POST(self) -> None:
        with tarfile.open(fileobj=io.BytesIO(self.body())) as context:
            self.server.files = [member.name for member in context.getmembers() if member.isfile()]
        self.reply(json.dumps({"error": "context caught", "errorDetail": {"message": "context caught"}}).encode())

    def body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") != "chunked":
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))
        chunks = []
        while size := int(self.rfile.readline().strip(), 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()
        self.rfile.readline()
        return b"".join(chunks)

    def reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Api-Version", "1.41")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted({name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()})


def docker_build_context(directory: Path) -> list[str]:
    """The files `docker build` in directory sends to the daemon, as the docker CLI packs them with .dockerignore.

    The classic builder (DOCKER_BUILDKIT=0) packs the context in the CLI and posts it to /build, where the stand-in
    daemon reads it; BuildKit applies the same .dockerignore rules."""
    docker = shutil.which("docker")
    assert docker is not None, "no docker CLI: tools/setup_test_env.sh installs Debian's docker.io (no daemon runs)"
    socket = directory / "docker.sock"
    with ContextCatcher(socket) as daemon:
        threading.Thread(target=daemon.serve_forever, daemon=True).start()
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(directory),
            "DOCKER_CONFIG": str(directory / ".docker-config"),
            "DOCKER_HOST": f"unix://{socket}",
            "DOCKER_BUILDKIT": "0",
        }
        result = subprocess.run(
            [docker, "build", "-f", "Dockerfile", "."],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        daemon.shutdown()
    assert "context caught" in result.stderr, result.stdout + result.stderr
    return sorted(daemon.files)


def packed_context(dockerfile: str, dockerignore: str) -> list[str]:
    """The files the docker CLI sends for a copy of this checkout that has the given Dockerfile and .dockerignore."""
    with tempfile.TemporaryDirectory(prefix="ctx-") as root:
        work = Path(root)
        for name in checkout_files():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, work / name)
        (work / "Dockerfile").write_text(dockerfile)
        (work / ".dockerignore").write_text(dockerignore)
        return docker_build_context(work)
