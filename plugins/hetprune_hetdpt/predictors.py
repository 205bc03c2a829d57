"""The Model Accuracy Predictor (MAP): a bivariate polynomial fitted by least squares."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetprune import HetpruneError
from hetprune.plugin_api import Section, number, setting, whole


def as_points(points) -> tuple[np.ndarray, int]:
    """``(n_attn, n_act, accuracy)`` triples as an ``(n, 3)`` float array, and how many distinct splits they hold
    (what a fit's minimum is counted in)."""
    pts = np.asarray([(float(a), float(m), float(acc)) for a, m, acc in points], dtype=float)
    return pts, (len({(a, m) for a, m, _ in pts.tolist()}) if len(pts) else 0)


def poly_terms(degree: int) -> list[tuple[int, int]]:
    """The monomials a^i m^j of total degree at most ``degree``."""
    return [(i, j) for i, j in itertools.product(range(degree + 1), repeat=2) if i + j <= degree]


def poly_design(terms, a, m) -> np.ndarray:
    a, m = np.asarray(a, dtype=float), np.asarray(m, dtype=float)
    return np.stack([a ** i * m ** j for i, j in terms], axis=-1)


def poly_lstsq(terms, pts: np.ndarray) -> np.ndarray:
    coef, *_ = np.linalg.lstsq(poly_design(terms, pts[:, 0], pts[:, 1]), pts[:, 2], rcond=None)
    return coef


def distinct(pts: np.ndarray) -> int:
    return len({(a, m) for a, m, _ in pts.tolist()})


def leave_two_out_rmse(pts: np.ndarray, degree: int) -> float | None:
    """The RMSE of a degree-``degree`` fit predicting every pair of points left out of it (each pair once),
    or None where no pair can be left out with enough points kept for the fit."""
    terms = poly_terms(degree)
    errors = []
    for i, j in itertools.combinations(range(len(pts)), 2):
        rest = np.delete(pts, [i, j], axis=0)
        if distinct(rest) < len(terms):
            continue
        coef = poly_lstsq(terms, rest)
        errors += list(poly_design(terms, pts[[i, j], 0], pts[[i, j], 1]) @ coef - pts[[i, j], 2])
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else None


@dataclass(frozen=True)
class PolyOptions(Section):
    """``hetdpt.predictor_options.poly``."""

    section: ClassVar[str] = "hetdpt.predictor_options.poly"
    degree: int | str = setting(2, "the polynomial's total degree, or auto: chosen by leave-2-out cross-validation")

    def __post_init__(self):
        if self.degree != "auto" and not whole(self.degree, 1):
            raise HetpruneError(f"poly predictor degree must be an integer >= 1 or 'auto' (chosen by leave-2-out "
                                f"cross-validation over 1, 2, 3, 4), got {self.degree!r}")


@dataclass(frozen=True)
class LocalOptions(Section):
    """``hetdpt.predictor_options.local``."""

    section: ClassVar[str] = "hetdpt.predictor_options.local"
    bandwidth: float = setting(2.0, "how far (in sites) a point's weight reaches")

    def __post_init__(self):
        if not number(self.bandwidth) or not self.bandwidth > 0:
            raise HetpruneError(f"local predictor bandwidth must be a positive number of sites, got {self.bandwidth!r}")


@dataclass(frozen=True)
class GPOptions(Section):
    """``hetdpt.predictor_options.gp``."""

    section: ClassVar[str] = "hetdpt.predictor_options.gp"
    lengthscale: float | None = setting(None, "the kernel's length scale in sites (null: fitted)")
    noise: float | None = setting(None, "the noise variance (null: fitted)")

    def __post_init__(self):
        for key in ("lengthscale", "noise"):
            value = getattr(self, key)
            if value is not None and (not number(value) or not value > 0):
                raise HetpruneError(f"gp predictor {key} must be a positive number (or null: fitted), got {value!r}")


class PolyPredictor:
    """Bivariate polynomial acc ~ P(n_attn, n_act) of total degree ``degree``, least squares.

    ``degree="auto"`` (the paper's choice): each degree of ``DEGREES`` that the points support is scored by
    leave-2-out cross-validation and the lowest CV RMSE wins (ties: the lower degree); the fit report lists
    every degree's CV RMSE and the chosen one.
    """

    name = "poly"
    Options = PolyOptions
    DEGREES = (1, 2, 3, 4)

    def __init__(self, **options) -> None:
        degree = PolyOptions.from_dict(options).degree
        self.auto = degree == "auto"
        self.degree = self.DEGREES[0] if self.auto else degree
        self.terms = poly_terms(self.degree)
        self.coef: np.ndarray | None = None
        self._report: dict = {}

    @property
    def min_points(self) -> int:
        """Distinct (n_attn, n_act) points the fit needs: one per coefficient (``auto``: the lowest degree's,
        plus the two a fold leaves out)."""
        return len(poly_terms(self.DEGREES[0])) + 2 if self.auto else len(self.terms)

    def _design(self, a, m) -> np.ndarray:
        return poly_design(self.terms, a, m)

    def _lstsq(self, pts: np.ndarray) -> np.ndarray:
        return poly_lstsq(self.terms, pts)

    def choose_degree(self, pts: np.ndarray) -> dict[int, float | None]:
        """Every candidate degree's leave-2-out CV RMSE; sets the degree to the lowest's."""
        cv = {d: leave_two_out_rmse(pts, d) for d in self.DEGREES}
        scored = {d: r for d, r in cv.items() if r is not None}
        if not scored:
            raise HetpruneError(f"poly with degree 'auto' needs at least {self.min_points} distinct "
                                f"(n_attn, n_act) points for leave-2-out cross-validation; got {distinct(pts)}")
        self.degree = min(scored, key=lambda d: (scored[d], d))
        self.terms = poly_terms(self.degree)
        return cv

    def fit(self, points):
        pts, n_distinct = as_points(points)
        cv = self.choose_degree(pts) if self.auto else None
        need = len(self.terms)
        if n_distinct < need:
            raise HetpruneError(f"a degree-{self.degree} poly predictor has {need} coefficients and needs at least "
                                f"{need} distinct (n_attn, n_act) points; got {n_distinct}. Collect more points or "
                                "lower the degree")
        self.coef = self._lstsq(pts)
        resid = self._design(pts[:, 0], pts[:, 1]) @ self.coef - pts[:, 2]
        loo = []
        if len(pts) > need:
            for i in range(len(pts)):
                rest = np.delete(pts, i, axis=0)
                if distinct(rest) < need:
                    continue
                c = self._lstsq(rest)
                loo.append(float(self._design(pts[i, 0], pts[i, 1]) @ c - pts[i, 2]))
        self._report = {
            "degree": self.degree,
            **({"degree_choice": "auto (leave-2-out cross-validation)",
                "cv_rmse": {str(d): r for d, r in cv.items()}} if cv is not None else {}),
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
    Options = LocalOptions
    min_points = 3

    def __init__(self, **options) -> None:
        self.bandwidth = float(LocalOptions.from_dict(options).bandwidth)
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
        pts, distinct = as_points(points)
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


class GPPredictor:
    """A plane plus a Gaussian process on what the plane leaves: smooth where points are dense, the
    plane's trend where they are not, and an uncertainty for every prediction (``uncertainty(a, m)``).

    The kernel is squared-exponential in sites; its length scale and the noise are chosen by the marginal
    likelihood over a small grid unless given. The fit report gives both, and the closed-form
    leave-one-out error.
    """

    name = "gp"
    Options = GPOptions
    description = "a plane plus a Gaussian process on its residuals, with an uncertainty per prediction"
    min_points = 3
    LENGTHS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    NOISES = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.3)

    def __init__(self, **options) -> None:
        o = GPOptions.from_dict(options)
        self.lengthscale, self.noise = o.lengthscale, o.noise
        self.state: dict | None = None
        self._report: dict = {}

    @staticmethod
    def _kernel(x: np.ndarray, y: np.ndarray, length: float) -> np.ndarray:
        d2 = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)
        return np.exp(-d2 / (2 * length ** 2))

    def _solve(self, x: np.ndarray, r: np.ndarray, length: float, noise: float):
        k = self._kernel(x, x, length) + noise * np.eye(len(x))
        chol = np.linalg.cholesky(k)
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
        nll = 0.5 * float(r @ alpha) + float(np.log(np.diag(chol)).sum())
        return chol, alpha, nll

    def fit(self, points):
        pts, distinct = as_points(points)
        if distinct < self.min_points:
            raise HetpruneError(f"the gp predictor fits a plane first and needs at least {self.min_points} distinct "
                                f"(n_attn, n_act) points; got {distinct}")
        x, y = pts[:, :2], pts[:, 2]
        design = np.column_stack([np.ones(len(x)), x])
        plane, *_ = np.linalg.lstsq(design, y, rcond=None)
        resid = y - design @ plane
        scale = float(resid.std()) or 1.0
        r = resid / scale
        best = None
        for length in ([self.lengthscale] if self.lengthscale else self.LENGTHS):
            for noise in ([self.noise] if self.noise else self.NOISES):
                try:
                    chol, alpha, nll = self._solve(x, r, length, noise)
                except np.linalg.LinAlgError:
                    continue
                if best is None or nll < best[0]:
                    best = (nll, length, noise, chol, alpha)
        if best is None:
            raise HetpruneError("the gp predictor could not fit these points (singular kernel); give it a noise")
        nll, length, noise, chol, alpha = best
        self.state = {"x": x, "plane": plane, "scale": scale, "length": length, "chol": chol, "alpha": alpha}
        k_inv = np.linalg.solve(chol.T, np.linalg.solve(chol, np.eye(len(x))))
        loo = alpha / np.diag(k_inv) * scale          # closed-form leave-one-out residuals
        fitted = np.array([self.predict(a, m) for a, m in x])
        self._report = {"lengthscale": length, "noise": noise, "points": len(pts),
                        "mae": float(np.mean(np.abs(fitted - y))), "rmse": float(np.sqrt(np.mean((fitted - y) ** 2))),
                        "loo_mae": float(np.mean(np.abs(loo))), "plane": [float(c) for c in plane]}
        return self

    def _parts(self, n_attn, n_act):
        if self.state is None:
            raise HetpruneError("the gp predictor must be fitted before it predicts")
        s = self.state
        q = np.array([[float(n_attn), float(n_act)]])
        k = self._kernel(q, s["x"], s["length"])[0]
        return s, q, k

    def predict(self, n_attn, n_act) -> float:
        s, q, k = self._parts(n_attn, n_act)
        return float(s["plane"][0] + q[0] @ s["plane"][1:] + s["scale"] * (k @ s["alpha"]))

    def uncertainty(self, n_attn, n_act) -> float:
        """The standard deviation of the prediction (accuracy points): near 0 at a measured split."""
        s, _, k = self._parts(n_attn, n_act)
        v = np.linalg.solve(s["chol"], k)
        return float(s["scale"] * np.sqrt(max(0.0, 1.0 - float(v @ v))))

    def fit_report(self) -> dict:
        return dict(self._report)
