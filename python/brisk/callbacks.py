"""Callbacks as transformers names them, called by the engine between steps, never inside one."""

import dataclasses


@dataclasses.dataclass
class TrainerState:
    """What transformers' TrainerState holds that a brisk run reports (trainer_state.json)."""

    epoch: float = 0.0
    global_step: int = 0
    max_steps: int = 0
    num_train_epochs: int = 0
    log_history: list = dataclasses.field(default_factory=list)
    best_metric: float = None
    best_model_checkpoint: str = None
    total_flos: float = 0.0

    def update(self, saved):
        """Takes the fields of a trainer_state.json."""
        for field in dataclasses.fields(self):
            if field.name in saved:
                setattr(self, field.name, saved[field.name])


@dataclasses.dataclass
class TrainerControl:
    """A callback sets should_training_stop to end the training after the step under way."""

    should_training_stop: bool = False


class TrainerCallback:
    """Base of brisk's callbacks; transformers.TrainerCallback objects work the same way."""

    def on_train_begin(self, args, state, control, **kwargs):
        pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        pass

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        pass

    def on_step_end(self, args, state, control, **kwargs):
        pass

    def on_save(self, args, state, control, **kwargs):
        pass

    def on_epoch_end(self, args, state, control, **kwargs):
        pass

    def on_train_end(self, args, state, control, **kwargs):
        pass


# The events a run calls, in the order of the methods above.
EVENTS = ("on_train_begin", "on_log", "on_evaluate", "on_step_end", "on_save", "on_epoch_end",
          "on_train_end")


class CallbackHandler:
    """Calls each callback's method of an event, in order, where it has one."""

    def __init__(self, callbacks):
        if not isinstance(callbacks, (list, tuple)):
            raise TypeError("callbacks must be a list of callbacks, not %s"
                            % type(callbacks).__name__)
        self.callbacks = []
        for callback in callbacks:
            self.add(callback)

    def add(self, callback):
        """Adds `callback` (an object, or a class made with no arguments), checked now: an event
        attribute it has is a method, and it has at least one."""
        callback = callback() if isinstance(callback, type) else callback
        name = type(callback).__name__
        events = [e for e in EVENTS if getattr(callback, e, None) is not None]
        if not events:
            raise TypeError("callback %s has none of the events (%s): subclass TrainerCallback"
                            % (name, ", ".join(EVENTS)))
        for event in events:
            if not callable(getattr(callback, event)):
                raise TypeError("callback %s: %s must be a method, not %s"
                                % (name, event, type(getattr(callback, event)).__name__))
        self.callbacks.append(callback)

    def call(self, event, args, state, control, **kwargs):
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None:
                method(args, state, control, **kwargs)
