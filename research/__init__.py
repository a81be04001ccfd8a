"""Research: the corpus generator, its phrase banks, training, evaluation and the placeholder model.

Nothing that serves requests imports this package (scripts/test checks it): it writes the
model directories in models/ and the reports in bench/, which serving code only reads.
"""
