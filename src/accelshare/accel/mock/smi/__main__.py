"""``python -m accelshare.accel.mock.smi``: the mock ``nvidia-smi`` (see the package)."""

import sys

from . import main

sys.exit(main())
