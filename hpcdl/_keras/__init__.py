"""The Keras machinery that ``hpcdl.keras`` (Keras 3, on the TensorFlow or PyTorch backend) and
``hpcdl.tensorflow.keras`` (whichever Keras ``tf.keras`` is: Keras 3, or tf-keras under
``TF_USE_LEGACY_KERAS=1``) share: the callbacks, elastic state and Keras 3 ``DistributedOptimizer``, written
against a :class:`~hpcdl._keras.framework.Framework` (what the framework API does for Keras) that the caller
hands over. This package imports neither ``hpcdl.tensorflow`` nor ``hpcdl.torch``, so the two public
packages depend on it and on their framework, never on each other.
"""
