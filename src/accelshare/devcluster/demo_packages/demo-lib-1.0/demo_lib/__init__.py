"""demo-lib 1.0: a tiny package the development cluster installs into one of its two
demo environments, so that two sessions can show two different library versions."""

__version__ = "1.0"


def greet(name: str) -> str:
    return f"hello {name} from demo-lib {__version__}"
