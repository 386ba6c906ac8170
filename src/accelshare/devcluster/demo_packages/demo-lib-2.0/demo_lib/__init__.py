"""demo-lib 2.0: like 1.0, with a new keyword (what changed between two versions)."""

__version__ = "2.0"


def greet(name: str, *, punctuation: str = "!") -> str:
    return f"hello {name} from demo-lib {__version__}{punctuation}"
