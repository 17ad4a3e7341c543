"""The dye-tag data plane: classify, choose, proxy, fall back, measure.

``make_app(config)`` builds the aiohttp application; ``tinct router`` runs it.
"""

from tinct.router.app import STATE, RouterConfig, RouterState, make_app
from tinct.router.table import CompiledTable, Route, TableHolder

__all__ = ["STATE", "CompiledTable", "Route", "RouterConfig", "RouterState", "TableHolder", "make_app"]
