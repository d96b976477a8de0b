"""Job files (YAML or JSON) parsed the same way by the server and the CLI client."""

import yaml


class _Loader(yaml.SafeLoader):
    """YAML without the YAML 1.1 surprises: timestamps stay strings (the API parses them)
    and sexagesimal numbers stay strings, so `at: [15:30]` is "15:30", not 930."""


def _scalar_string(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    assert isinstance(node, yaml.ScalarNode)
    return loader.construct_scalar(node)


def _number_or_string(loader: yaml.SafeLoader, node: yaml.Node) -> object:
    assert isinstance(node, yaml.ScalarNode)
    text = str(loader.construct_scalar(node))
    if ":" in text:
        return text
    if node.tag.endswith(":int"):
        return loader.construct_yaml_int(node)
    return loader.construct_yaml_float(node)


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _scalar_string)
_Loader.add_constructor("tag:yaml.org,2002:int", _number_or_string)
_Loader.add_constructor("tag:yaml.org,2002:float", _number_or_string)


def parse_document(text: str) -> object:
    """The YAML (JSON is YAML) document in `text`; yaml.YAMLError if it is not one."""
    document: object = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader
    return document
