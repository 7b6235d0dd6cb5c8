"""otm: optimal transport with membership cost for multi-draft speculative decoding."""

from .laws import OtmError, check_law
from .schemes import IID, Greedy, Scheme, SpecHub, Table, WithoutReplacement, make_scheme

__version__ = "0.1.0"

__all__ = [
    "OtmError",
    "check_law",
    "Scheme",
    "IID",
    "WithoutReplacement",
    "Greedy",
    "SpecHub",
    "Table",
    "make_scheme",
]
