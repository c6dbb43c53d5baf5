"""TensorBoard event files: the reference brisk's writer must reproduce, and a check with the real
reader.

  python scripts/make_tensorboard_fixture.py write      # tests/fixtures/tensorboard/reference*.tfevents
  python scripts/make_tensorboard_fixture.py read DIR   # prints every scalar in DIR's event files

The references are framed and serialized by tensorboard's own RecordWriter and protobuf classes
(pip install tensorboard), with fixed wall times so the C++ test can compare bytes: scalars, and
text summaries built as torch's SummaryWriter.add_text builds them (transformers writes "args" and
"model_config" so).
"""
import glob
import os
import sys

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "tensorboard", "reference.tfevents")
OUT_TEXT = os.path.join(HERE, "..", "tests", "fixtures", "tensorboard", "reference_text.tfevents")

# (wall_time, step, tag, text)
TEXTS = [
    (1700000001.5, 0, "args", '{\n  "learning_rate": 5e-05\n}'),
    (1700000002.0, 7, "model_config", "caf\u00e9 " + "x" * 300),
]

# (wall_time, step, tag, value); the first event is the file version.
SCALARS = [
    (1700000001.25, 1, "train/loss", 0.6931471805599453),
    (1700000001.25, 1, "train/learning_rate", 5e-05),
    (1700000002.5, 2, "eval/accuracy", 0.875),
    (1700000003.0, 1000000000000, "train/grad_norm", -1.5e-30),
]


def write():
    with open(OUT, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=1700000000.0, file_version="brain.Event:2")
                .SerializeToString())
        for wall, step, tag, value in SCALARS:
            s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
            w.write(event_pb2.Event(wall_time=wall, step=step, summary=s).SerializeToString())
    print("wrote", OUT)
    with open(OUT_TEXT, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=1700000000.0, file_version="brain.Event:2")
                .SerializeToString())
        for wall, step, tag, text in TEXTS:
            meta = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
            tensor = tensor_pb2.TensorProto(
                dtype="DT_STRING", string_val=[text.encode("utf-8")],
                tensor_shape=tensor_shape_pb2.TensorShapeProto(
                    dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
            s = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, metadata=meta,
                                                                     tensor=tensor)])
            w.write(event_pb2.Event(wall_time=wall, step=step, summary=s).SerializeToString())
    print("wrote", OUT_TEXT)


def read(folder):
    from tensorboard.backend.event_processing import event_accumulator
    for path in sorted(glob.glob(os.path.join(folder, "**", "*tfevents*"), recursive=True)):
        acc = event_accumulator.EventAccumulator(path)
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            for e in acc.Scalars(tag):
                print(os.path.basename(path), tag, e.step, e.value)


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write()
    elif sys.argv[1:2] == ["read"]:
        read(sys.argv[2])
    else:
        sys.exit(__doc__)
