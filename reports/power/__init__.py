"""Detection power: graded planted bugs for each calibrated row, and the smallest size each row catches.

``plant`` plants a bug family of a chosen size (reports/power/plant.py); ``measure`` runs each family's
row on the control and on growing sizes (reports/power/measure.py); ``write`` renders the table and the
figure into docs/ (``python -m reports.power --write-docs``).
"""

from reports.power.measure import Cell, measure, smallest
from reports.power.plant import FAMILIES, Family, plant
from reports.power.subjects import DTYPES, Subject, subjects

__all__ = ["Cell", "DTYPES", "FAMILIES", "Family", "Subject", "measure", "plant", "smallest", "subjects"]
