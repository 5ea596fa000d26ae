"""A turn through the FSM: the phase loop, the turn rules, deadlines, interventions."""
