"""``python -m accelshare.client.cli`` = ``accelshare`` (how ``dev up`` starts its daemons)."""

from . import main

main()
