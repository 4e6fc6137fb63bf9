"""How steps are scheduled: sync (one after the other), async (generation overlapped with training, policy
lag <= 1) and the Ray rollout pool both use."""
