"""The on-demand lifecycle: what each job does, as plain functions of a Fleet."""

from vmpool.lifecycle.fleet import *  # noqa: F403
from vmpool.lifecycle.fleet import JOBS, __all__  # noqa: F401
