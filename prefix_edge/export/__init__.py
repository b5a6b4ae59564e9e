"""Export side: turn a base model + task file into a bundle. Imports torch/transformers/optimum
only inside the functions that need them."""
