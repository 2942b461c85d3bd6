"""Gates: components that stop the run when what came before is not good enough."""
