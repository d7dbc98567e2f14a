"""The few-label fit in one place: the policy's rule (`fitting`), the family over it
(`fit_family`), the bias members, the temperature and its folds, the probe maths, the logits
inverse that reads a hidden state back from a logits row, and the saved fit with its one
reader (`fitted.read_fit`). A layer between the core and the engines: it imports the core
only, so each engine's adapter for fitted rows lives with its engine.
"""
