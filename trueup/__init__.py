"""trueup keeps Linux edge routers at their desired configuration."""

__version__ = "0.1.0"
