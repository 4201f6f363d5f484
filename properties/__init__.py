"""Model-agnostic invariant checks for attention models. See the Property suite issue."""
