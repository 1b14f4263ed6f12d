"""Shadow replays of sampled production tasks under perturbation (architecture.md, ``shadow``).

Sampling of finished production trials, the replay-target protocol, the tool proxy (record-replay
of the production run's tool results, injected faults, environment perturbations, side effects
blocked), prompt rewriters and the canary comparison. Nothing here touches production side effects.
"""
