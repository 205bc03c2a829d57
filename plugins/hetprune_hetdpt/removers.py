"""Removers: thin wrappers over ``hetprune.model.surgery``."""

from hetprune.plugin_api import surgery


class AttnIdentity:
    """Remove an attention sub-block: the branch and its norm are gone."""

    name = "attn-identity"
    kind = "attn"
    mode = "identity"

    def remove(self, model, site):
        surgery.remove_attention(model, site.block, self.mode)
        return {"attn_mode": self.mode}


class AttnLnResidual(AttnIdentity):
    """Remove an attention sub-block the reference release's way: x + LN1(x)."""

    name = "attn-ln-residual"
    mode = "ln-residual"


class ActIdentity:
    """Remove an MLP activation: the MLP becomes fc2(fc1(x))."""

    name = "act-identity"
    kind = "act"

    def remove(self, model, site):
        surgery.remove_activation(model, site.block)
        return {}
