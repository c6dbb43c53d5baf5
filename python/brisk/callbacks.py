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


class CallbackHandler:
    """Calls each callback's method of an event, in order, where it has one."""

    def __init__(self, callbacks):
        self.callbacks = []
        for callback in callbacks:
            self.add(callback)

    def add(self, callback):
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def call(self, event, args, state, control, **kwargs):
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is not None:
                method(args, state, control, **kwargs)
