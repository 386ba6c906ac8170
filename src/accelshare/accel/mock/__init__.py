"""The mock accelerator plugin: mocked GPUs/NPUs described in ``mock-accelerator.toml``."""

from .config import MockConfig, MockDeviceSpec, load_mock_config, parse_mock_config
from .plugin import MOCK_DEFAULT_QUANTUM, MockPlugin, create_plugin, mig_slot_name

__all__ = [
    "MOCK_DEFAULT_QUANTUM",
    "MockConfig",
    "MockDeviceSpec",
    "MockPlugin",
    "create_plugin",
    "load_mock_config",
    "mig_slot_name",
    "parse_mock_config",
]
