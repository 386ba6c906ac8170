"""``python -m accelshare.agent [--config agent.toml] [--dev]``: same as
``accelshare server agent``."""

from accelshare.client.cli.server import server_app

if __name__ == "__main__":
    import sys

    server_app(["agent", *sys.argv[1:]], prog_name="accelshare server")
