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


class LocalPredictor:
    """Locally weighted linear regression: each prediction is a plane fitted to the points near it.

    The paper's global quadratic lets far-away points (heavy attention removal,
    where accuracy falls steeply) bend the surface near the budget line; here a
    point's weight falls with its distance in sites, ``exp(-d² / 2 bandwidth²)``,
    so a measured point close to a split dominates its prediction. The fit
    report gives the leave-one-out error like ``poly``'s.
    """

    name = "local"
    min_points = 3

    def __init__(self, bandwidth: float = 2.0):
        if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not 0 < bandwidth < float("inf"):
            raise HetpruneError(f"local predictor bandwidth must be a positive number of sites, got {bandwidth!r}")
        self.bandwidth = float(bandwidth)
        self.pts: np.ndarray | None = None
        self._report: dict = {}

    @staticmethod
    def _at(pts: np.ndarray, a: float, m: float, bandwidth: float) -> float:
        d2 = (pts[:, 0] - a) ** 2 + (pts[:, 1] - m) ** 2
        w = np.sqrt(np.exp(-d2 / (2 * bandwidth ** 2)))
        design = np.stack([np.ones(len(pts)), pts[:, 0] - a, pts[:, 1] - m], axis=-1)
        coef, *_ = np.linalg.lstsq(design * w[:, None], pts[:, 2] * w, rcond=None)
        return float(coef[0])  # the plane's value at (a, m)

    def fit(self, points):
        pts = np.asarray([(float(a), float(m), float(acc)) for a, m, acc in points], dtype=float)
        distinct = len({(a, m) for a, m, _ in pts.tolist()}) if len(pts) else 0
        if distinct < self.min_points:
            raise HetpruneError(f"the local predictor fits a plane and needs at least {self.min_points} distinct "
                                f"(n_attn, n_act) points; got {distinct}")
        self.pts = pts
        resid = np.array([self._at(pts, a, m, self.bandwidth) - acc for a, m, acc in pts])
        loo = [self._at(np.delete(pts, i, axis=0), pts[i, 0], pts[i, 1], self.bandwidth) - pts[i, 2]
               for i in range(len(pts)) if distinct > self.min_points]
        self._report = {"bandwidth": self.bandwidth, "points": len(pts), "mae": float(np.mean(np.abs(resid))),
                        "rmse": float(np.sqrt(np.mean(resid ** 2))),
                        "loo_mae": float(np.mean(np.abs(loo))) if loo else None}
        return self

    def predict(self, n_attn, n_act) -> float:
        if self.pts is None:
            raise HetpruneError("the local predictor must be fitted before it predicts")
        return self._at(self.pts, float(n_attn), float(n_act), self.bandwidth)

    def fit_report(self) -> dict:
        return dict(self._report)
