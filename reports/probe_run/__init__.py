"""`attnlab probe` at scale: a plan before the work (:mod:`.plan`), progress on stderr (:mod:`.progress`),
each method's file written as it finishes and a manifest to resume from (:mod:`.manifest`), and the
methods themselves (:mod:`.steps`). :func:`reports.pipeline.probe` puts them together."""
