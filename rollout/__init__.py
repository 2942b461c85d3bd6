"""Versioned rollouts: a candidate version is loaded on the canary servers, verified, moved through traffic steps and
promoted, or rolled back; the state lives outside the controller (the model repository, or cluster objects)."""
