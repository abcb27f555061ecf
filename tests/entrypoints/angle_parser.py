"""A --tool-parser-plugin file for the tests: Hermes' JSON calls inside <call>...</call>."""

from loom.entrypoints.openai.tool_parsers import HermesParser, register_tool_parser


@register_tool_parser("angle_calls")
class AngleParser(HermesParser):
    START, END = "<call>", "</call>"
