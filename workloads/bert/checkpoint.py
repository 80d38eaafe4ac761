"""The MLPerf reference checkpoint's TF1 variable names, mapped onto our parameter paths.

Framework-neutral: one table used by both models. A path is the flax params path (the Keras
model names its layers the same way: tf_layers.variables_by_path). `transpose` marks
cls/seq_relationship/output_weights, stored [2, hidden] (the reference multiplies by its
transpose), where our next-sentence head is a Dense kernel [hidden, 2].
"""


def tf1_variable_table(num_layers: int) -> list[tuple[str, tuple[str, ...], bool]]:
  """[(tf1 name, params path, transpose)] for every model variable of the reference
  checkpoint (its optimizer slots adam_m/adam_v and global_step are not model variables)."""
  ln = lambda prefix, path: [(f"{prefix}/LayerNorm/gamma", path + ("scale",), False),
                             (f"{prefix}/LayerNorm/beta", path + ("bias",), False)]
  dense = lambda prefix, path: [(f"{prefix}/kernel", path + ("kernel",), False),
                                (f"{prefix}/bias", path + ("bias",), False)]
  table = [
      ("bert/embeddings/word_embeddings", ("word_embeddings", "embedding"), False),
      ("bert/embeddings/position_embeddings", ("position_embeddings", "embedding"), False),
      ("bert/embeddings/token_type_embeddings", ("token_type_embeddings", "embedding"), False),
      *ln("bert/embeddings", ("embeddings_LayerNorm",)),
  ]
  for i in range(num_layers):
    tf1, ours = f"bert/encoder/layer_{i}", f"layer_{i}"
    for name in ("query", "key", "value"):
      table += dense(f"{tf1}/attention/self/{name}", (ours, name))
    table += dense(f"{tf1}/attention/output/dense", (ours, "attention_output"))
    table += ln(f"{tf1}/attention/output", (ours, "attention_LayerNorm"))
    table += dense(f"{tf1}/intermediate/dense", (ours, "intermediate"))
    table += dense(f"{tf1}/output/dense", (ours, "output"))
    table += ln(f"{tf1}/output", (ours, "output_LayerNorm"))
  table += dense("bert/pooler/dense", ("pooler",))
  table += dense("cls/predictions/transform/dense", ("mlm_transform",))
  table += ln("cls/predictions/transform", ("mlm_LayerNorm",))
  table += [("cls/predictions/output_bias", ("mlm_output_bias",), False),
            ("cls/seq_relationship/output_weights", ("nsp", "kernel"), True),
            ("cls/seq_relationship/output_bias", ("nsp", "bias"), False)]
  return table


def read_tf1_checkpoint(path: str, num_layers: int):
  """Yields (params path, numpy value) for every table entry, transposed where marked; a
  missing variable is an error that names it. Reads with tf.train.load_checkpoint (imported
  here: the checkpoint format is TensorFlow's, whichever framework trains)."""
  from workloads.common.host_tf import tf
  reader = tf.train.load_checkpoint(path)
  stored = reader.get_variable_to_shape_map()
  missing = [name for name, _, _ in tf1_variable_table(num_layers) if name not in stored]
  if missing:
    raise ValueError(f"checkpoint {path} lacks {len(missing)} BERT variables, e.g. "
                     f"{missing[:3]}; is num_layers={num_layers} right?")
  for name, ours, transpose in tf1_variable_table(num_layers):
    value = reader.get_tensor(name)
    yield ours, (value.T if transpose else value)
