"""Tests of the training package (tiny offline models, a local Ray cluster).

Nothing here may reach the model hub. huggingface_hub reads these variables when it is imported, and this
package is imported before its conftest and test modules, so setting them here covers every import.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
