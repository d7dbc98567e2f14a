"""A dozen short reviews, written for these tests (six of each label), for the
scikit-learn tests of `Classifier` on the small model."""

from __future__ import annotations

LABELS = ["positive", "negative"]
REVIEWS = [
    ("A warm, funny film that I would happily watch again.", "positive"),
    ("The soup was cold and the waiter ignored us all night.", "negative"),
    ("Brilliant acting and a score that gave me chills.", "positive"),
    ("It broke after two days and support never answered.", "negative"),
    ("Lovely little hotel, spotless rooms and kind staff.", "positive"),
    ("Dull plot, wooden dialogue, I left at the interval.", "negative"),
    ("Fast delivery and the shoes fit perfectly.", "positive"),
    ("The battery dies before lunch; a waste of money.", "negative"),
    ("My kids loved every page of this book.", "positive"),
    ("Rude staff and a two-hour wait for a table.", "negative"),
    ("Great value, sturdy build, works exactly as described.", "positive"),
    ("The sequel is a boring, noisy mess.", "negative"),
]
TEXTS = [text for text, _ in REVIEWS]
NAMES = [label for _, label in REVIEWS]
