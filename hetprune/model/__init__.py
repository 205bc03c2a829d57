"""The model layer: what a model is made of and how it changes: adapters per family, sites, surgery,
widths, MAC counting, model specs and recipes, and the contract's rules for components that change a model."""
