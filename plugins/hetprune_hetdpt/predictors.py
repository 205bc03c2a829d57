"""The Model Accuracy Predictor (MAP): a bivariate polynomial fitted by least squares."""

from __future__ import annotations

import itertools

import numpy as np

from hetprune import HetpruneError


class PolyPredictor:
    """Bivariate polynomial acc ~ P(n_attn, n_act) of total degree `degree`, least squares."""

    name = "poly"

    def __init__(self, degree: int = 2):
        if not isinstance(degree, int) or degree < 1:
            raise HetpruneError(f"poly predictor degree must be an integer >= 1, got {degree!r}")
        self.degree = degree
        self.terms = [(i, j) for i, j in itertools.product(range(degree + 1), repeat=2) if i + j <= degree]
        self.coef: np.ndarray | None = None
        self._report: dict = {}

    @property
    def min_points(self) -> int:
        """Distinct (n_attn, n_act) points the fit needs: one per coefficient."""
        return len(self.terms)

    def _design(self, a, m) -> np.ndarray:
        a, m = np.asarray(a, dtype=float), np.asarray(m, dtype=float)
        return np.stack([a ** i * m ** j for i, j in self.terms], axis=-1)

    def _lstsq(self, pts: np.ndarray) -> np.ndarray:
        coef, *_ = np.linalg.lstsq(self._design(pts[:, 0], pts[:, 1]), pts[:, 2], rcond=None)
        return coef

    def fit(self, points):
        pts = np.asarray([(float(a), float(m), float(acc)) for a, m, acc in points], dtype=float)
        need = len(self.terms)
        distinct = len({(a, m) for a, m, _ in pts.tolist()}) if len(pts) else 0
        if distinct < need:
            raise HetpruneError(f"a degree-{self.degree} poly predictor has {need} coefficients and needs at least "
                                f"{need} distinct (n_attn, n_act) points; got {distinct}. Collect more points or "
                                "lower the degree")
        self.coef = self._lstsq(pts)
        resid = self._design(pts[:, 0], pts[:, 1]) @ self.coef - pts[:, 2]
        loo = []
        if len(pts) > need:
            for i in range(len(pts)):
                rest = np.delete(pts, i, axis=0)
                if len({(a, m) for a, m, _ in rest.tolist()}) < need:
                    continue
                c = self._lstsq(rest)
                loo.append(float(self._design(pts[i, 0], pts[i, 1]) @ c - pts[i, 2]))
        self._report = {
            "degree": self.degree,
            "points": len(pts),
            "mae": float(np.mean(np.abs(resid))),
            "rmse": float(np.sqrt(np.mean(resid ** 2))),
            "loo_mae": float(np.mean(np.abs(loo))) if loo else None,
            "coefficients": {f"a^{i} m^{j}": float(c) for (i, j), c in zip(self.terms, self.coef)},
        }
        return self

    def predict(self, n_attn, n_act) -> float:
        if self.coef is None:
            raise HetpruneError("the poly predictor must be fitted before it predicts")
        return float(self._design(n_attn, n_act) @ self.coef)

    def fit_report(self) -> dict:
        return dict(self._report)
