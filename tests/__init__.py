# Imported here so jaxtyping's import hook finds it as ``tests.shape_checker`` (pyproject addopts).
from tests.helpers.shapecheck import shape_checker  # noqa: F401
