"""GLUE-style data files as users write them with pandas, for tests/test_evaluate.cpp:

  python scripts/make_glue_fixtures.py     (pip install pandas)

train.csv is DataFrame.to_csv() with its default index (a first column named "" that pandas
reads back as "Unnamed: 0"), dev.csv and test.csv carry GLUE's "idx" column, and test.csv has
GLUE's label -1 on every row (the test splits' labels are withheld).
"""
import os

import pandas as pd

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                   "glue_pandas")

GOOD = ["a good film", "great plot and fine end", "lovely, the end", "fine acting"]
BAD = ["a bad film", "awful plot and dull end", "poor, the end", "dull acting"]


def rows(n, seed):
    out = []
    for i in range(n):
        positive = (i * 7 + seed) % 3 != 0
        out.append(((GOOD if positive else BAD)[(i + seed) % 4] + " " + str(i % 5), int(positive)))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    train = pd.DataFrame(rows(24, 1), columns=["sentence", "label"])
    train.to_csv(os.path.join(OUT, "train.csv"))  # the index written, as by default
    for name, n, seed, withheld in (("dev.csv", 8, 2, False), ("test.csv", 6, 3, True)):
        df = pd.DataFrame(rows(n, seed), columns=["sentence", "label"])
        if withheld:
            df["label"] = -1
        df.insert(0, "idx", range(n))
        df.to_csv(os.path.join(OUT, name), index=False)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
