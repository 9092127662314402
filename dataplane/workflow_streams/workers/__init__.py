"""Background workers that run inside every data-plane replica."""
