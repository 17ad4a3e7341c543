"""The dye-tag data plane: classify, choose, proxy, fall back, measure.

``Router(config)`` puts it together (an httptools HTTP/1.1 server and upstream pool);
``tinct router`` runs it.
"""

from tinct.router.app import Router
from tinct.router.config import RouterConfig, RouterState
from tinct.router.table import CompiledTable, Route, TableHolder

__all__ = ["CompiledTable", "Route", "Router", "RouterConfig", "RouterState", "TableHolder"]
