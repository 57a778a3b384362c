"""Reporting: what a pipeline's committed results read as. A pipeline's report
(:mod:`~fedssl.reporting.report`), the benchmark board across pipelines
(:mod:`~fedssl.reporting.board`), the cells and tables both are made of
(:mod:`~fedssl.reporting.formatting`), figures (:mod:`~fedssl.reporting.figures`), seed
statistics (:mod:`~fedssl.reporting.stats`), and the docs' generated blocks and sentences
(:mod:`~fedssl.reporting.docs`, :mod:`~fedssl.reporting.readme_facts`). Nothing here trains or
branches on a method; the modules sit at different layers (pyproject's import contract), so this
file imports none of them."""
